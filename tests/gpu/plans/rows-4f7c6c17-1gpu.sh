# Issue 25: every vLLM row with the drafter 4f7c6c17 but the offline speed pairs, both releases at
# once on ONE GPU (an H200: the machine lent when no machine of four is). On the device, after
# `prepare`:
#   . tests/gpu/plans/rows-4f7c6c17-1gpu.sh && bash tests/gpu/remote.sh lanes-bg
# The lanes are rows-4f7c6c17.sh's without their speed lanes: a speed run needs the GPU to itself
# (realshape refuses it in a shared lane), and item 5's bar counts only the served pair
# (`served-all`, speed phase), which runs alone after the lanes. No GPU lists: every lane and the
# NVFP4 walk run on GPU 0. Twelve engines and the walk share 16 CPU cores, so the lanes are slower
# than on the machine of four; each still holds 4 GiB of KV cache and a tenth of the GPU.
# tests/unit/test_gpu_plans.py checks these lists as lanes-bg will.
lanes() { tr -d ' \n'; }

RS_PARALLEL_21=$(lanes <<'LANES'
trained-dflash-trained-fa2-cg-bf16-capture,trained-refgroups-bf16-capture;
trained-dflash-trained-fa2-cg-bf16-capture-without-dflash-target-layer-ids-offset,
  trained-dflash-trained-fa2-cg-bf16-capture-without-gemma4-dflash-embed-scale-logit-softcap;
trained-ref-bf16-bi-noinductor,trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor;
trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-dflash-target-layer-ids-offset,
  trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-gemma4-dflash-embed-scale-logit-softcap;
trained-ref-nvfp4-bi-noinductor,trained-dflash-trained-fa2-cg-nvfp4-bi-noinductor;
trained-ref-bf16,trained-dflash-trained-fa2-cg-nvfp4
LANES
)
RS_PARALLEL_33=$(lanes <<'LANES'
v33-trained-dflash-trained-fa2-cg-bf16-capture,v33-trained-refgroups-bf16-capture;
v33-trained-ref-bf16,v33-trained-dflash-trained-fa2-cg-bf16-capture-without-gemma4-dflash-embed-scale-logit-softcap;
v33-trained-ref-bf16-bi-noinductor,v33-trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor;
v33-trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-gemma4-dflash-embed-scale-logit-softcap;
v33-trained-ref-nvfp4-bi-noinductor,v33-trained-dflash-trained-fa2-cg-nvfp4-bi-noinductor;
v33-trained-dflash-trained-fa2-cg-nvfp4
LANES
)
RS_LANE_GPUS_21=
RS_LANE_GPUS_33=
RS_GPU_UTIL=0.1
RS_KV_CACHE_GIB=4
RS_WALK_NVFP4=1
export RS_PARALLEL_21 RS_PARALLEL_33 RS_LANE_GPUS_21 RS_LANE_GPUS_33 RS_GPU_UTIL RS_KV_CACHE_GIB RS_WALK_NVFP4
