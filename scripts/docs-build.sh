#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml) into build/site/, in strict mode: any
# warning fails the build, including a cross-reference to an object that does not exist,
# a `::: module` directive that cannot be loaded, a link to a missing page or anchor and
# a page left out of the nav. Needs no GPU and no built core: the API reference is read
# from the source by griffe. Extra arguments go to `mkdocs build`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's environment, as the other scripts use (an active venv or conda, $PYTHON,
# else .venv): a bare python3 is Debian's, where pip refuses to install (PEP 668).
. scripts/lib/python-env.sh
gk_use_python

# The doc tools, pinned to minor series known to build this site without warnings.
# ruff only formats the long signatures in the reference.
"$PY" -m pip install -q \
  "mkdocs==1.6.*" \
  "mkdocs-material==9.8.*" \
  "mkdocstrings==1.0.*" \
  "mkdocstrings-python==2.0.*" \
  "mkdocs-autorefs==1.4.*" \
  "ruff==0.17.*"

# Material prints a banner about MkDocs 2.0 on every run; it is not a build warning.
export NO_MKDOCS_2_WARNING=1
"$PY" -m mkdocs build --strict --site-dir build/site "$@"
echo "docs: built build/site/index.html"
