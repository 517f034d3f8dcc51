# Sourced by the set-up, test and quickstart scripts: which OpenMMLab stack, which venv.
#   MMSOFT_STACK=openmmlab (default) -> $ROOT/.venv ; MMSOFT_STACK=onedl -> $ROOT/.venv-onedl ;
#   MMSOFT_STACK=oldest -> $ROOT/.venv-oldest
#   MMSOFT_VENV overrides the folder.
STACK="${MMSOFT_STACK:-openmmlab}"
if [ "$STACK" = openmmlab ]; then
  VENV="${MMSOFT_VENV:-$ROOT/.venv}"
else
  VENV="${MMSOFT_VENV:-$ROOT/.venv-$STACK}"
fi
