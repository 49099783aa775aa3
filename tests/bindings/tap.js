// A small TAP harness for the gjs binding tests: check() runs a case,
// finish() prints the plan and the results and exits with the verdict.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import System from 'system';

const results = [];

export function check(name, fn) {
    try {
        fn();
        results.push(['ok', name, '']);
    } catch (e) {
        results.push(['not ok', name, String(e)]);
    }
}

export function assert(cond, what) {
    if (!cond)
        throw new Error(`assertion failed: ${what}`);
}

export function finish(prefix) {
    print(`1..${results.length}`);
    results.forEach(([status, name, why], i) =>
        print(`${status} ${i + 1} ${prefix}${name}${why ? ` # ${why}` : ''}`));
    System.exit(results.every(r => r[0] === 'ok') ? 0 : 1);
}
