# One H200 (143771 MiB, driver 580.159.04), 2026-11-27, the tree of the one-token kernels (7053651, the branch's
# commit before its squash into the commit that added this folder), vLLM 0.26.0, torch 2.11.0+cu130; after the
# unpack calls, two calls on the same machine (results accumulate in /tmp/srv), each .ab/serve.sh of
# ../serving-2026-11-27/serve.sh:
#   VARIANTS=samoyeds-fp8 CONC=1 PPC=16 BUDGET=560 bash .ab/serve.sh
#   VARIANTS=dense CONC=1 PPC=16 BUDGET=560 bash .ab/serve.sh
