// Entry point of gpucheck::knn_mean_sq_dist (issue 4): device guard, input checks, scratch
// from the caching allocator, launches on the current stream. Kernels: knn_cuda.cu.
#include "knn/knn.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common.h"
#include "library.h"

namespace gpucheck::knn {
namespace {

constexpr const char* kOp = "knn_mean_sq_dist";

// Reads the bounds words (synchronises the current stream), raises on NaN/inf, and returns
// the Morton grid: origin = box minimum, scale = cells per unit on a cubic 2^21 grid.
void morton_grid(const at::Tensor& points,  // [N, 3]
                 const at::Tensor& bounds,  // [kBoundsWords] int32 on the device
                 float3* origin, float* scale) {
  const at::Tensor host = bounds.to(at::kCPU);
  const auto* w = reinterpret_cast<const uint32_t*>(host.const_data_ptr<int32_t>());
  if (w[6] != 0xFFFFFFFFu) {
    const at::Tensor row = points[static_cast<int64_t>(w[6])].to(at::kCPU);
    const float* r = row.const_data_ptr<float>();
    TORCH_CHECK_VALUE(false, kOp, ": points must be finite, but row ", w[6], " is (", r[0],
                      ", ", r[1], ", ", r[2], ")");
  }
  float lo[3];
  double extent = 0.0;
  for (int a = 0; a < 3; ++a) {
    lo[a] = decode_bound(w[a], /*is_max=*/false);
    const float hi = decode_bound(w[3 + a], /*is_max=*/true);
    extent = std::max(extent, static_cast<double>(hi) - static_cast<double>(lo[a]));
  }
  *origin = make_float3(lo[0], lo[1], lo[2]);
  const double cells = static_cast<double>((1u << 21) - 1u);
  // All points equal (extent 0): every code is 0, which is fine for an exact search.
  const double s = extent > 0.0 ? cells / extent : 0.0;
  *scale = static_cast<float>(std::min(s, static_cast<double>(std::numeric_limits<float>::max())));
}

}  // namespace

at::Tensor knn_mean_sq_dist_cuda(const at::Tensor& points,  // [N, 3] float32, CUDA, contiguous
                                 int64_t k) {
  // The guard needs a CUDA device, so this one check comes first.
  check_cuda(points, kOp, "points");
  GPUCHECK_DEVICE_GUARD(points);
  TORCH_CHECK_VALUE(points.dim() == 2 && points.size(1) == 3, kOp,
                    ": points must be [N, 3], got ", points.sizes());
  TORCH_CHECK_TYPE(points.scalar_type() == at::kFloat, kOp, ": points must be float32, got ",
                   points.scalar_type());
  TORCH_CHECK_VALUE(points.is_contiguous(), kOp, ": points must be contiguous, got strides ",
                    points.strides(), " for sizes ", points.sizes(), " (call .contiguous())");
  TORCH_CHECK_VALUE(k >= 1 && k <= kMaxK, kOp, ": k must be in [1, ", kMaxK, "], got ", k);
  const int64_t n64 = points.size(0);
  TORCH_CHECK_VALUE(n64 > k, kOp, ": needs more than k points (each point has k neighbours "
                    "other than itself), got N = ", n64, " with k = ", k);
  TORCH_CHECK_VALUE(n64 < std::numeric_limits<int32_t>::max(), kOp,
                    ": at most 2^31 - 2 points are supported, got N = ", n64);
  const int n = static_cast<int>(n64);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto options = points.options();
  const float* xyz = points.const_data_ptr<float>();
  at::Tensor out = at::empty({n64}, options);

  // 1. bounding box and the NaN/inf check (one small device-to-host copy).
  const at::Tensor bounds = at::empty({kBoundsWords}, options.dtype(at::kInt));
  C10_CUDA_CHECK(cudaMemsetAsync(bounds.data_ptr(), 0xFF, kBoundsWords * sizeof(uint32_t),
                                 stream));
  launch_bounds(xyz, n, reinterpret_cast<uint32_t*>(bounds.data_ptr<int32_t>()), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  float3 origin;
  float scale;
  morton_grid(points, bounds, &origin, &scale);

  // 2. Morton codes, sorted with their indices (24 bytes per point while sorting).
  at::Tensor keys = at::empty({2 * n64}, options.dtype(at::kLong));
  at::Tensor order = at::empty({2 * n64}, options.dtype(at::kInt));
  auto* keys_ptr = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  int32_t* order_ptr = order.data_ptr<int32_t>();
  launch_morton(xyz, n, origin, scale, keys_ptr, order_ptr, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const size_t temp_bytes = sort_temp_bytes(n);
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                              options.dtype(at::kByte));
  int32_t* sorted_order = nullptr;
  C10_CUDA_CHECK(sort_by_key(temp.data_ptr(), temp_bytes, keys_ptr, keys_ptr + n, order_ptr,
                             order_ptr + n, n, &sorted_order, stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // Back to the caching allocator (stream-ordered, so later allocations may reuse them).
  keys.reset();
  temp.reset();

  // 3./4. sorted points (16 bytes per point) and the box tree (about 1 byte per point).
  Tree tree{};
  int64_t nodes = 0;
  int64_t offset[kMaxLevels] = {};
  tree.count[0] = (n + kLeafSize - 1) / kLeafSize;
  for (int l = 0;; ++l) {
    offset[l] = nodes;
    nodes += tree.count[l];
    if (tree.count[l] == 1) {
      tree.top = l;
      break;
    }
    TORCH_INTERNAL_ASSERT(l + 1 < kMaxLevels, "knn: tree deeper than kMaxLevels");
    tree.count[l + 1] = (tree.count[l] + kFanout - 1) / kFanout;
  }
  at::Tensor sorted = at::empty({n64, 4}, options);
  at::Tensor boxes = at::empty({2, nodes, 4}, options);
  auto* sorted_ptr = reinterpret_cast<float4*>(sorted.data_ptr<float>());
  auto* lo = reinterpret_cast<float4*>(boxes[0].data_ptr<float>());
  auto* hi = reinterpret_cast<float4*>(boxes[1].data_ptr<float>());
  for (int l = 0; l <= tree.top; ++l) {
    tree.lo[l] = lo + offset[l];
    tree.hi[l] = hi + offset[l];
  }
  launch_gather(xyz, sorted_order, n, sorted_ptr, lo, hi, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  for (int l = 1; l <= tree.top; ++l) {
    launch_level(tree.lo[l - 1], tree.hi[l - 1], tree.count[l - 1], lo + offset[l],
                 hi + offset[l], tree.count[l], stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // 5. queries, written straight to the caller's order.
  launch_query(sorted_ptr, n, tree, static_cast<int>(k), out.data_ptr<float>(), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

GPUCHECK_TORCH_LIBRARY_IMPL(CUDA, m) {
  m.impl("knn_mean_sq_dist", &knn_mean_sq_dist_cuda);
}

}  // namespace gpucheck::knn
