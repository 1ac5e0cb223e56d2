# Issue 25: every vLLM row with the drafter 4f7c6c17 but the offline speed pairs, both releases at
# once on ONE GPU (an H200: the machine lent when no machine of four is; ran 2026-11-28). On the
# device, after `prepare`:
#   . tests/gpu/plans/rows-4f7c6c17-1gpu.sh && bash tests/gpu/remote.sh lanes-bg
# rows-4f7c6c17.sh's lanes without their first, the speed pair: a speed run needs the GPU to itself
# (realshape refuses it in a shared lane), and item 5's bar counts only the served pair
# (`served-all`, speed phase), which runs alone after the lanes. No GPU lists: every lane and the
# NVFP4 walk run on GPU 0. Twelve engines and the walk share 16 CPU cores; each holds 4 GiB of KV
# cache and a tenth of the GPU, as in the plan of four.
# tests/unit/test_gpu_plans.py checks these lists as lanes-bg will.
. "$(dirname "${BASH_SOURCE[0]}")/rows-4f7c6c17.sh"
case "$RS_PARALLEL_21;$RS_PARALLEL_33" in
    trained-speed-*\;*v33-trained-speed-*) ;;
    *) echo "rows-4f7c6c17.sh no longer opens with its speed lanes: mend rows-4f7c6c17-1gpu.sh" >&2; return 1 ;;
esac
RS_PARALLEL_21=${RS_PARALLEL_21#*;}
RS_PARALLEL_33=${RS_PARALLEL_33#*;}
RS_LANE_GPUS_21=
RS_LANE_GPUS_33=
export RS_PARALLEL_21 RS_PARALLEL_33 RS_LANE_GPUS_21 RS_LANE_GPUS_33
