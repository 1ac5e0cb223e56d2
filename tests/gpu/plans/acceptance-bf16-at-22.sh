# Issue 25, item 4: the bf16 rows with the drafter 4f7c6c17 at 1, 8 and 22 requests in flight
# (acceptance-rows-1gpu.sh's bf16 rows are the capture runs, at 1, 8 and 17), under default
# numerics (with the target's own batching-noise twin) and exact numerics, both releases at once
# on one GPU. On the GPU host, after `remote.sh prepare`:
#   . tests/gpu/plans/acceptance-bf16-at-22.sh && bash tests/gpu/remote.sh lanes-bg
# The references are the staged raw records (.stage/realshape-raw-*). Each verb then walks the
# reference along every DFlash run's own output (walk_along.py, on the GPU) before its merge.
# tests/unit/test_gpu_plans.py checks these lists as lanes-bg will.
lanes() { tr -d ' \n'; }

RS_PARALLEL_21=$(lanes <<'LANES'
trained-dflash-trained-fa2-cg-bf16,trained-refgroups-bf16;
trained-dflash-trained-fa2-cg-bf16-bi-noinductor
LANES
)
RS_PARALLEL_33=$(lanes <<'LANES'
v33-trained-dflash-trained-fa2-cg-bf16,v33-trained-refgroups-bf16;
v33-trained-dflash-trained-fa2-cg-bf16-bi-noinductor
LANES
)
RS_LANE_GPUS_21=
RS_LANE_GPUS_33=
RS_GPU_UTIL=0.1
RS_KV_CACHE_GIB=4
export RS_PARALLEL_21 RS_PARALLEL_33 RS_LANE_GPUS_21 RS_LANE_GPUS_33 RS_GPU_UTIL RS_KV_CACHE_GIB
