"""A user's kernel plugin in CUDA C++: layernorm over the last axis, one block per row.

    tgc-run model.tg --backend cuda --kernels examples/kernels/layernorm_cuda.py --check

docs/kernels.md walks through it. tgc renders the Jinja template below for each instance the
planner meets (its shapes and element types), compiles it with nvcc through the caches its own
kernels use, and checks it in float64 against the reference graph, at several widths, before
the planner may choose it. It needs a GPU to be checked and run; without one, `--kernels`
refuses it ("runs on cuda, not loaded here").
"""

from tgc.planner.cuda_source import cuda_source_kernel
from tgc.planner.kernel import Lowered

# what the kernel computes: the same reference as layernorm_numpy.py's
REFERENCE = """
func.func @layernorm(%x: tensor<4x8xf32>, %gamma: tensor<8xf32>, %beta: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = hl.layernorm %x, %gamma, %beta {axis = -1, eps = 1.0e-05} : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}
"""  # noqa: E501

THREADS = 256

TEMPLATE = """
// {{ entry }}: layernorm of rows {{ inputs[0].shape[-1] }} wide, one block of 256 threads
// each; sums in f32 (tgc_to_f32 comes from tgc's prelude)
__device__ __forceinline__ float block_sum(float v, float* partial) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < blockDim.x / 32; ++w) total += partial[w];
  __syncthreads();  // partial is written again by the next sum
  return total;
}

extern "C" __global__ void {{ entry }}(
    const {{ inputs[0].ctype }}* __restrict__ x,
    const {{ inputs[1].ctype }}* __restrict__ gamma,
    const {{ inputs[2].ctype }}* __restrict__ beta,
    {{ outputs[0].ctype }}* __restrict__ y) {
  constexpr int WIDTH = {{ inputs[0].shape[-1] }};
  __shared__ float partial[32];
  const long long row = blockIdx.x;
  const {{ inputs[0].ctype }}* xr = x + row * WIDTH;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < WIDTH; i += blockDim.x) sum += tgc_to_f32(xr[i]);
  const float mean = block_sum(sum, partial) / WIDTH;
  float squares = 0.0f;
  for (int i = threadIdx.x; i < WIDTH; i += blockDim.x) {
    const float d = tgc_to_f32(xr[i]) - mean;
    squares += d * d;
  }
  const float rstd = rsqrtf(block_sum(squares, partial) / WIDTH + 1.0e-5f);
  for (int i = threadIdx.x; i < WIDTH; i += blockDim.x) {
    const float v = (tgc_to_f32(xr[i]) - mean) * rstd * tgc_to_f32(gamma[i]) + tgc_to_f32(beta[i]);
    y[row * WIDTH + i] = {{ outputs[0].ctype }}(v);
  }
}
"""


def launch(inputs, outputs, attrs):
    """One block per row: the element count over the row's width."""
    x = inputs[0]
    return (x.size // x.shape[-1],), (THREADS,)


def tgc_kernels():
    return [
        cuda_source_kernel(
            "user.cuda_layernorm",
            template=TEMPLATE,
            entry="user_layernorm",
            launch=launch,
            reference=(REFERENCE, Lowered(REFERENCE)),
            max_rel_error=1e-5,
            shape_constants=True,
            doc="layernorm over the last axis, one CUDA block per row",
        )
    ]
