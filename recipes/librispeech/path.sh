# Sourced by run.sh: puts the repo's virtualenv and tools on PATH.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -d "$_root/.venv/bin" ] && export PATH="$_root/.venv/bin:$PATH"
export PATH="$_root/tools:$PATH"
export PYTHONUNBUFFERED=1
. "$(dirname "${BASH_SOURCE[0]}")/cmd.sh"
unset _root
