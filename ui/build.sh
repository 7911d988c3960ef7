#!/bin/sh
# Copies the pinned, minified front-end libraries into the Python package (checked in, shipped as
# package data), so the master needs no Node at run time. Run after `npm ci` in ui/.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/../control_plane/ui/static/vendor"
mkdir -p "$dest"
cp "$here/node_modules/htmx.org/dist/htmx.min.js" "$dest/htmx.min.js"
cp "$here/node_modules/uplot/dist/uPlot.iife.min.js" "$dest/uPlot.iife.min.js"
cp "$here/node_modules/uplot/dist/uPlot.min.css" "$dest/uPlot.min.css"
cp "$here/node_modules/htmx.org/LICENSE" "$dest/htmx.LICENSE"
cp "$here/node_modules/uplot/LICENSE" "$dest/uPlot.LICENSE"
echo "vendor assets copied to $dest"
