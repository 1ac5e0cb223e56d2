# The acceptance page's vLLM rows (drafter 4f7c6c17, issue 25), both releases at once on a host
# with four GPUs. On the GPU host, after `remote.sh prepare`:
#   . tests/gpu/plans/acceptance-rows-4gpu.sh && bash tests/gpu/remote.sh lanes-bg
# (the lane lists live here, not on the command line). Each release's speed pair has a GPU of
# its own (lane 0 takes the first GPU of its list, every other lane the second). Every reference
# (one request at a time, bf16 and NVFP4 exact, and the default-numerics NVFP4 one that the
# NVFP4 row is judged against) and the capture runs' batch-noise twins (the no-drafter engine in
# the capture's groups) run on this host. The default-numerics NVFP4 reference does not reproduce
# from run to run (Marlin): the page judges against the one this host ran beside its row.
# tests/unit/test_gpu_plans.py checks these lists as lanes-bg will.
lanes() { tr -d ' \n'; }

RS_PARALLEL_21=$(lanes <<'LANES'
trained-speed-dflash-trained-fa2-cg-bf16,trained-speed-nodrafter-fa2-cg-bf16;
trained-dflash-trained-fa2-cg-bf16-capture,trained-refgroups-bf16-capture;
trained-dflash-trained-fa2-cg-bf16-capture-without-dflash-target-layer-ids-offset,
  trained-dflash-trained-fa2-cg-bf16-capture-without-gemma4-dflash-embed-scale-logit-softcap;
trained-ref-bf16-bi-noinductor,trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor;
trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-dflash-target-layer-ids-offset,
  trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-gemma4-dflash-embed-scale-logit-softcap;
trained-ref-nvfp4-bi-noinductor,trained-dflash-trained-fa2-cg-nvfp4-bi-noinductor,trained-ref-nvfp4;
trained-ref-bf16,trained-dflash-trained-fa2-cg-nvfp4
LANES
)
RS_PARALLEL_33=$(lanes <<'LANES'
v33-trained-speed-dflash-trained-fa2-cg-bf16,v33-trained-speed-nodrafter-fa2-cg-bf16;
v33-trained-dflash-trained-fa2-cg-bf16-capture,v33-trained-refgroups-bf16-capture;
v33-trained-ref-bf16,v33-trained-dflash-trained-fa2-cg-bf16-capture-without-gemma4-dflash-embed-scale-logit-softcap;
v33-trained-ref-bf16-bi-noinductor,v33-trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor;
v33-trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-gemma4-dflash-embed-scale-logit-softcap,
  v33-trained-ref-nvfp4;
v33-trained-ref-nvfp4-bi-noinductor,v33-trained-dflash-trained-fa2-cg-nvfp4-bi-noinductor;
v33-trained-dflash-trained-fa2-cg-nvfp4
LANES
)
RS_LANE_GPUS_21=1,0,0,0,0,0,0
RS_LANE_GPUS_33=3,2,2,2,2,2,2
# Six or seven engines a GPU: a tenth of it and 4 GiB of KV cache each.
RS_GPU_UTIL=0.1
RS_KV_CACHE_GIB=4
# The NVFP4 walks of this drafter, the NVFP4 rows' references, beside the lanes (on GPU 0).
RS_WALK_NVFP4=1
export RS_PARALLEL_21 RS_PARALLEL_33 RS_LANE_GPUS_21 RS_LANE_GPUS_33 RS_GPU_UTIL RS_KV_CACHE_GIB RS_WALK_NVFP4
