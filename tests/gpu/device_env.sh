# Source on a GPU machine (Ubuntu + CUDA 13 + PyTorch wheels) before running forge-train
# built elsewhere: makes cudart's companions (cuBLASLt, cuDNN, NCCL) and any carried shared
# libraries (DIR/lib, e.g. libonnx_proto.so.1) findable. Usage: . tests/gpu/device_env.sh DIR
carry="${1:-.devcarry}"
nv=$(python3 -c "import nvidia, os; print(nvidia.__path__[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$carry/lib:/usr/local/cuda/lib64${nv:+:$nv/cudnn/lib:$nv/nccl/lib:$nv/cublas/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
