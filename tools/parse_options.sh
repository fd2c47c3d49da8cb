# Usage: . tools/parse_options.sh  (sourced by recipes after declaring defaults)
# Turns --some-option VALUE (or --some-option=VALUE) into some_option=VALUE for every variable the
# caller already defined; --help prints the caller's header comment. Unknown options are errors.
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h)
      sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'
      exit 0 ;;
    --*=*)
      _name="${1%%=*}"; _value="${1#*=}"; shift ;;
    --*)
      [ $# -ge 2 ] || { echo "$0: option $1 needs a value" >&2; exit 1; }
      _name="$1"; _value="$2"; shift 2 ;;
    *) break ;;
  esac
  _var="${_name#--}"; _var="${_var//-/_}"
  if ! declare -p "$_var" >/dev/null 2>&1; then
    echo "$0: unknown option $_name" >&2; exit 1
  fi
  printf -v "$_var" '%s' "$_value"
done
unset _name _value _var
