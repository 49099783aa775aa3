#!/usr/bin/env python3
"""Checks of the API reference, for meson test.

    docs-check.py gir GIR
        fails for every public symbol of GIR without a description: classes,
        records, enums and their members, constructors, methods, functions,
        properties, signals, constants, callbacks, fields, parameters and
        return values (the <doc> elements g-ir-scanner writes from the gtk-doc
        comments).

    docs-check.py examples GIR PYTHON GJS
        runs every ```python and ```js block of the classes' descriptions in
        GIR (the examples of each class page) with PYTHON and `GJS -m`; fails
        when one fails. Each block must be a whole program.

    docs-check.py html DIR URLMAP
        reads gi-docgen's output in DIR: fails for a link to a file that is
        not there, a link into a namespace that URLMAP (the urlmap.js of
        Gmlp.toml.in) does not map, or a page that says "No description
        available".

    docs-check.py generate GI-DOCGEN TOML GIR INCLUDE-DIR CONTENT-DIR
        builds the reference as docs/meson.build does (warnings fatal) into
        a temporary directory, then checks it as `html` does, with
        CONTENT-DIR/urlmap.js.

SPDX-License-Identifier: LGPL-2.1-or-later
"""
import html.parser
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

CORE = '{http://www.gtk.org/introspection/core/1.0}'
GLIB = '{http://www.gtk.org/introspection/glib/1.0}'
# Elements that are parts of a symbol, not symbols of their own.
PARTS = {CORE + t for t in ('doc', 'doc-deprecated', 'doc-version', 'doc-stability',
                            'source-position', 'type', 'array', 'attribute',
                            'implements', 'prerequisite', 'varargs')}


def has_doc(element):
    doc = element.find(CORE + 'doc')
    return doc is not None and (doc.text or '').strip() != ''


def undocumented(element, path):
    """Yields a line for each symbol under element that has no description."""
    for child in element:
        if child.tag in PARTS:
            continue
        kind = child.tag.split('}')[1]
        if kind == 'parameters':
            for param in child:
                if param.tag in (CORE + 'parameter', CORE + 'instance-parameter') and not has_doc(param):
                    yield '%s: parameter %s' % (path, param.get('name'))
            continue
        if kind == 'return-value':
            rtype = child.find(CORE + 'type')
            if (rtype is None or rtype.get('name') != 'none') and not has_doc(child):
                yield '%s: return value' % path
            continue
        name = '%s.%s' % (path, child.get('name'))
        if not has_doc(child):
            yield '%s (%s)' % (name, kind)
        yield from undocumented(child, name)


def check_gir(gir):
    namespace = ET.parse(gir).getroot().find(CORE + 'namespace')
    missing = list(undocumented(namespace, namespace.get('name')))
    for line in missing:
        print('undocumented: %s' % line)
    print('%d undocumented symbols in %s' % (len(missing), gir))
    return 1 if missing else 0


FENCE = re.compile(r'^```(python|js)\n(.*?)^```', re.S | re.M)


def check_examples(gir, python, gjs):
    namespace = ET.parse(gir).getroot().find(CORE + 'namespace')
    failed = ran = 0
    classes_without = []
    with tempfile.TemporaryDirectory() as tmp:
        for cls in namespace.iter(CORE + 'class'):
            doc = cls.find(CORE + 'doc')
            blocks = FENCE.findall(doc.text if doc is not None else '')
            if {lang for lang, _ in blocks} != {'python', 'js'}:
                classes_without.append(cls.get('name'))
            for i, (lang, code) in enumerate(blocks):
                path = os.path.join(tmp, '%s-%d.%s' % (cls.get('name'), i, 'py' if lang == 'python' else 'js'))
                with open(path, 'w') as f:
                    f.write(code)
                argv = [python, path] if lang == 'python' else [gjs, '-m', path]
                proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=120)
                ran += 1
                status = 'ok' if proc.returncode == 0 else 'FAILED'
                print('%s: %s example of %s' % (status, lang, cls.get('name')))
                if proc.returncode != 0:
                    failed += 1
                    print(code + '----\n' + proc.stdout)
    for name in classes_without:
        print('no Python and gjs example in the description of %s' % name)
    print('%d examples, %d failed' % (ran, failed))
    return 1 if failed or classes_without else 0


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.namespaces = set(), set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == 'a' and 'data-namespace' in attrs:
            self.namespaces.add(attrs['data-namespace'])
        elif tag == 'a' and attrs.get('href'):
            self.hrefs.add(attrs['href'])


def check_html(directory, urlmap):
    with open(urlmap) as f:
        mapped = set(re.findall(r"\[\s*'([A-Za-z0-9]+)'\s*,", f.read()))
    errors = []
    pages = sorted(p for p in os.listdir(directory) if p.endswith('.html'))
    for page in pages:
        with open(os.path.join(directory, page), encoding='utf-8') as f:
            text = f.read()
        if 'No description available' in text:
            errors.append('%s: "No description available"' % page)
        links = Links()
        links.feed(text)
        for ns in sorted(links.namespaces - mapped):
            errors.append('%s: a link into %s, which %s does not map' % (page, ns, os.path.basename(urlmap)))
        for href in sorted(links.hrefs):
            target = href.split('#')[0]
            if not target or re.match(r'^[a-z]+:', target):
                continue
            if not os.path.exists(os.path.join(directory, target)):
                errors.append('%s: a link to %s, which is not there' % (page, target))
    for e in errors:
        print(e)
    print('%d pages, %d problems' % (len(pages), len(errors)))
    return 1 if errors or not pages else 0


def generate(gidocgen, toml, gir, include_dir, content_dir):
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([gidocgen, 'generate', '--quiet', '--fatal-warnings',
                               '--add-include-path=' + include_dir, '--config=' + toml,
                               '--output-dir=' + out, '--no-namespace-dir',
                               '--content-dir=' + content_dir, gir])
        if proc.returncode != 0:
            print('gi-docgen failed (%d)' % proc.returncode)
            return 1
        return check_html(out, os.path.join(content_dir, 'urlmap.js'))


def main(argv):
    if len(argv) == 3 and argv[1] == 'gir':
        return check_gir(argv[2])
    if len(argv) == 5 and argv[1] == 'examples':
        return check_examples(argv[2], argv[3], argv[4])
    if len(argv) == 4 and argv[1] == 'html':
        return check_html(argv[2], argv[3])
    if len(argv) == 7 and argv[1] == 'generate':
        return generate(*argv[2:])
    sys.exit(__doc__)


if __name__ == '__main__':
    sys.exit(main(sys.argv))
