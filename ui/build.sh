#!/bin/sh
# Copies the pinned, minified front-end libraries into the Python package (checked in, shipped as
# package data), so the master needs no Node at run time. Run after `npm ci` in ui/.
# axe-core (a dev dependency) goes to the browser tests only (tests/ui/vendor/), never the package.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/../control_plane/ui/static/vendor"
tests="$here/../tests/ui/vendor"
mkdir -p "$dest" "$tests"
cp "$here/node_modules/uplot/dist/uPlot.iife.min.js" "$dest/uPlot.iife.min.js"
cp "$here/node_modules/uplot/dist/uPlot.min.css" "$dest/uPlot.min.css"
cp "$here/node_modules/uplot/LICENSE" "$dest/uPlot.LICENSE"
cp "$here/node_modules/axe-core/axe.min.js" "$tests/axe.min.js"
cp "$here/node_modules/axe-core/LICENSE" "$tests/axe-core.LICENSE"
echo "vendor assets copied to $dest and $tests"
