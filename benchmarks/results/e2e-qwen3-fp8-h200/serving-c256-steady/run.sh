# One H200, 2026-11-27, main at d6aab27 (its decode tables do not reach T = 256), .ab/serve.sh of
# ../serving-2026-11-27/serve.sh after the three unpack calls:
#   VARIANTS=samoyeds-fp8 CONC=256 PPC=4 BUDGET=570 bash .ab/serve.sh
# Dense FP8 at 256 clients was not run: the session's device time ran out.
