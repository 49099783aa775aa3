// SPDX-License-Identifier: LGPL-2.1-or-later
// Where gi-docgen's links to other namespaces go: main.js resolves each
// <a class="external" data-namespace="NS" data-link="..."> against this map.
// Keep in step with the [dependencies] of Gmlp.toml.in (tests/docs-check.py
// checks that every namespace the HTML links to is here).
baseURLs = [
  [ 'GLib', 'https://docs.gtk.org/glib/' ],
  [ 'GObject', 'https://docs.gtk.org/gobject/' ],
  [ 'Gio', 'https://docs.gtk.org/gio/' ],
]
