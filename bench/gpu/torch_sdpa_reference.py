# PyTorch's scaled_dot_product_attention on its FlashAttention-2 backend (with and without
# dropout 0.1) and on its cuDNN backend (without), causal, bf16, at the attention shapes of
# bench_gpu_train's four models: the reference for bench_flash_kernels (the own flash
# kernels). Forward and backward (forward + backward minus forward), median of 20, ms and
# TFLOP/s (causal: half of 4 B NH S^2 HD forward, 2.5x that backward).
# The fourth shape's K and V have all 32 heads (no grouped-query repetition): the same
# attention FLOPs as the Llama-style 1B's 32 query heads over 8 groups.
# Usage (on the GPU machine, where PyTorch is installed): python3 bench/gpu/torch_sdpa_reference.py
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.manual_seed(0)
def bench(fn, reps=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts=[]
    for _ in range(reps):
        a=torch.cuda.Event(enable_timing=True); b=torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]
for B,S,NH,NG,HD in [(64,1024,12,12,64),(64,1024,16,16,64),(16,2048,16,16,128),(16,2048,32,8,64)]:
    q=torch.randn(B,NH,S,HD,device='cuda',dtype=torch.bfloat16,requires_grad=True)
    k=torch.randn(B,NH,S,HD,device='cuda',dtype=torch.bfloat16,requires_grad=True)
    v=torch.randn(B,NH,S,HD,device='cuda',dtype=torch.bfloat16,requires_grad=True)
    fl=2.0*B*NH*S*S*HD
    for be,name in [(SDPBackend.FLASH_ATTENTION,'flash'),(SDPBackend.CUDNN_ATTENTION,'cudnn')]:
      for p in (0.0,0.1):
        if be==SDPBackend.CUDNN_ATTENTION and p>0: continue
        with sdpa_kernel(be):
            try:
                o=F.scaled_dot_product_attention(q,k,v,is_causal=True,dropout_p=p)
                g=torch.randn_like(o)
                tf=bench(lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True,dropout_p=p))
                def fb():
                    o=F.scaled_dot_product_attention(q,k,v,is_causal=True,dropout_p=p); o.backward(g)
                tfb=bench(fb)
                print(f"| torch SDPA {name} p={p} | B{B} S{S} NH{NH} HD{HD} | fwd {tf:.3f} ms {fl/tf/1e9:.1f} TF/s | bwd {tfb-tf:.3f} ms {2.5*fl/(tfb-tf)/1e9:.1f} TF/s |")
            except Exception as e: print(name,p,'failed',str(e)[:100])
