# One H200, 2026-11-27, main at d6aab27 (its decode tables do not reach T = 256), .ab/serve.sh of
# ../serving-2026-11-27/serve.sh after the three unpack calls:
#   VARIANTS=samoyeds-fp8 CONC=256 PPC=4 BUDGET=570 bash .ab/serve.sh
# Dense FP8 the same way, later that day on one H200 of the same kind (main at 997994a; serve-dense-fp8-*,
# variant-dense-fp8.json, server-dense-fp8.log.gz):
#   VARIANTS=dense-fp8 CONC=256 PPC=4 BUDGET=570 bash .ab/serve.sh
# Its timed rounds kept compiling (DeepGEMM JIT cache entries), so results.md here holds samoyeds FP8 only.
