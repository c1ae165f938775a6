# Sourced first by the repository's commands, with their arguments (`. scripts/help.sh "$@"`):
# -h or --help among them prints the command's header comment (its usage) and exits 0, before
# anything is set up, built or overwritten.
for _help_arg in "$@"; do
  case "$_help_arg" in
    -h | --help)
      sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
      exit 0
      ;;
  esac
done
unset _help_arg
