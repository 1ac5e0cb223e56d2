# The acceptance page's vLLM rows of the staged trained drafter (issue 25) but the offline speed
# pairs, both releases at once on ONE GPU (an H200): `make gpu-acceptance` runs it. By hand, on the
# GPU host after `remote.sh prepare`:
#   . tests/gpu/plans/acceptance-rows-1gpu.sh && bash tests/gpu/remote.sh lanes-bg
# acceptance-rows-4gpu.sh's lanes without their first, the speed pair: a speed run needs the GPU
# to itself (realshape refuses it in a shared lane), and item 5's bar counts only the served pair
# (the served page's `served-all`, speed phase). No GPU lists: every lane and the NVFP4 walk run
# on GPU 0. Sixteen engines and the walk share the host's CPU cores; each holds 4 GiB of KV cache
# and a tenth of the GPU, as in the four-GPU plan.
# tests/unit/test_gpu_plans.py checks these lists as lanes-bg will.
. "$(dirname "${BASH_SOURCE[0]}")/acceptance-rows-4gpu.sh"
case "$RS_PARALLEL_21;$RS_PARALLEL_33" in
    trained-speed-*\;*v33-trained-speed-*) ;;
    *) echo "acceptance-rows-4gpu.sh no longer opens with its speed lanes: mend acceptance-rows-1gpu.sh" >&2; return 1 ;;
esac
RS_PARALLEL_21=${RS_PARALLEL_21#*;}
RS_PARALLEL_33=${RS_PARALLEL_33#*;}
# The bf16 rows at 1, 8 and 22 in flight (acceptance-bf16-at-22.sh's lanes) beside them, so the
# one command makes every row of the page: twelve lanes ran in about 690 s on an H200; these two
# a release add engines, not length (their runs took under 630 s as four lanes alone).
at22=$(RS_PARALLEL_21= RS_PARALLEL_33= bash -c ". '$(dirname "${BASH_SOURCE[0]}")/acceptance-bf16-at-22.sh' && echo \"\$RS_PARALLEL_21|\$RS_PARALLEL_33\"")
RS_PARALLEL_21="$RS_PARALLEL_21;${at22%|*}"
RS_PARALLEL_33="$RS_PARALLEL_33;${at22#*|}"
RS_LANE_GPUS_21=
RS_LANE_GPUS_33=
export RS_PARALLEL_21 RS_PARALLEL_33 RS_LANE_GPUS_21 RS_LANE_GPUS_33
