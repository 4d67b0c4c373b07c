// Entry points of the Gaussian-splatting rasterizer's ops (schemas at the end):
//   splat_project           per Gaussian projection + validation + the binning-memory preflight
//                           (failure 3 of docs/failures.md) + tile binning (sort, ranges); its
//                           Gaussian parameters float32, bfloat16 or float16 (all one dtype),
//                           everything it returns float32 / int32
//   (render and its backward: float32 only; with 16-bit parameters they take the float32
//   opacities and background that splat_project returns)
//   splat_render            per tile compositing
//   splat_render_backward   its gradient (splat_project_backward: splat_project_backward.cpp)
// Each: device guard, input checks, buffers from the caching allocator, launches on the
// current stream. Kernels: splat_cuda.cu (forward), splat_backward.cu (backward).
#include "splat/splat.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "library.h"
#include "splat/splat_checks.h"

namespace gpucheck::splat {
namespace {

constexpr const char* kOp = "splat_project";
// The message prefix by which gpucheck.kernels.splat.op recognises a failed preflight (raised
// here as torch.OutOfMemoryError) and turns it into gpucheck.errors.BudgetExceeded.
constexpr const char* kBudgetPrefix = "splat_project: binning budget exceeded: ";
// A Gaussian "covers most of the image" when its tile rectangle holds more than this share of
// the tiles; when many do, the scales were most likely activated twice (story 3).
constexpr double kLargeShare = 0.25;
constexpr double kSuspectShare = 0.1;

// splat_project's inputs (splat_checks.h for the rest).
void check_input(const at::Tensor& ref, const at::Tensor& t, const char* name,
                 std::initializer_list<int64_t> shape, const char* op = kOp,
                 at::ScalarType dtype = at::kFloat, const char* ref_name = "means",
                 const std::string& why = "") {
  check_tensor(ref, t, name, shape, op, dtype, ref_name, why);
}

std::string values_of(const at::Tensor& t) {  // any floating dtype, printed as float32
  const at::Tensor host = t.detach().to(at::kCPU).to(at::kFloat).contiguous().view(-1);
  const float* v = host.const_data_ptr<float>();
  std::ostringstream out;
  out << "[";
  for (int64_t k = 0; k < host.numel(); ++k) out << (k ? ", " : "") << v[k];
  out << "]";
  return out.str();
}

// Raises a ValueError naming the first invalid input found by the preprocess kernel.
void raise_bad_input(const int32_t* bad, int64_t n, const at::Tensor& means,
                     const at::Tensor& scales, const at::Tensor& rotations,
                     const at::Tensor& opacities, const at::Tensor& viewmat, const at::Tensor& K,
                     const at::Tensor& background) {
  TORCH_CHECK_VALUE(bad[kBadCamera] == kNone, kOp,
                    ": viewmat must be a finite world-to-camera matrix with bottom row "
                    "[0, 0, 0, 1] (3DGS's world_view_transform is stored transposed), K must "
                    "be [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0, and the "
                    "background finite; got viewmat ", values_of(viewmat), ", K ",
                    values_of(K), ", background ", values_of(background));
  if (bad[kBadNonFinite] < n) {
    const int64_t r = bad[kBadNonFinite];
    TORCH_CHECK_VALUE(false, kOp, ": inputs must be finite, but Gaussian ", r,
                      " holds a NaN/inf: means ", values_of(means[r]), ", scales ",
                      values_of(scales[r]), ", rotations ", values_of(rotations[r]),
                      ", opacity ", values_of(opacities[r]), " (or its colours / SH)");
  }
  if (bad[kBadScale] < n) {
    const int64_t r = bad[kBadScale];
    TORCH_CHECK_VALUE(false, kOp, ": scales must be positive (activated, exp of the "
                      "log-scales), got ", values_of(scales[r]), " for Gaussian ", r,
                      ": raw log-scales from a checkpoint need exp first");
  }
  if (bad[kBadOpacity] < n) {
    const int64_t r = bad[kBadOpacity];
    TORCH_CHECK_VALUE(false, kOp, ": opacities must be in [0, 1] (activated, sigmoid of the "
                      "logits), got ", values_of(opacities[r]), " for Gaussian ", r);
  }
  if (bad[kBadRotation] < n) {
    TORCH_CHECK_VALUE(false, kOp, ": rotations hold an all-zero quaternion (cannot be "
                      "normalized) for Gaussian ", bad[kBadRotation]);
  }
}

// The evidence of a failed preflight: what was asked for, and why it is probably that large.
// gpucheck.errors.MemoryAnomalyError parses this message back into its fields: keep the two
// in step (tests/ops/test_ops_splat.py holds a recorded one).
[[noreturn]] void raise_budget(const std::string& reason, int64_t n, int64_t total,
                               int64_t bytes, int64_t free_bytes, const at::Tensor& radii,
                               const at::Tensor& counts, int64_t tiles, int64_t width,
                               int64_t height) {
  const at::Tensor r_host = radii.to(at::kCPU);
  const at::Tensor c_host = counts.to(at::kCPU);
  const int32_t* r = r_host.const_data_ptr<int32_t>();
  const int64_t* c = c_host.const_data_ptr<int64_t>();
  std::vector<int32_t> visible;
  int64_t large = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (r[i] > 0) visible.push_back(r[i]);
    if (static_cast<double>(c[i]) > kLargeShare * static_cast<double>(tiles)) ++large;
  }
  std::sort(visible.begin(), visible.end());
  auto pct = [&](double q) {
    if (visible.empty()) return int32_t{0};
    return visible[static_cast<size_t>(q * static_cast<double>(visible.size() - 1) + 0.5)];
  };
  const double share = n ? static_cast<double>(large) / static_cast<double>(n) : 0.0;
  const bool suspect = share >= kSuspectShare ||
                       2 * static_cast<int64_t>(pct(0.5)) > std::max(width, height);
  std::ostringstream msg;
  msg << kBudgetPrefix << reason << ". " << n << " Gaussians (" << visible.size()
      << " visible) touch " << total << " tiles in total (" << tiles << " tiles of "
      << width << "x" << height << "), binning needs " << bytes << " bytes, " << free_bytes
      << " bytes free; radius "
      << "percentiles (visible, px) p50 " << pct(0.5) << ", p90 " << pct(0.9) << ", p99 "
      << pct(0.99) << ", max " << (visible.empty() ? 0 : visible.back()) << "; " << large
      << " Gaussians (" << 100.0 * share << " %) cover more than 25 % of the image. Hint: "
      << (suspect ? "scales look already exponentiated: activation applied twice? (3DGS "
                    "checkpoints store log-scales; exp them exactly once)"
                  : "render fewer Gaussians or a smaller image, or raise the budget");
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
}

// Bytes the caching allocator holds unused on `device`: what it could hand out without a new
// cudaMalloc (a host-side read of its statistics).
int64_t cached_free_bytes(c10::DeviceIndex device) {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    const auto agg = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    return std::max<int64_t>(
        0, stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current);
  } catch (const c10::Error&) {
    return 0;  // an allocator backend without statistics: count the driver's only
  }
}

// What the driver reports free on the current device (cudaMemGetInfo, a driver call).
int64_t driver_free_bytes() {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

int bits_for(int64_t values) {  // bits needed for the numbers 0 .. values - 1
  int bits = 0;
  while ((int64_t{1} << bits) < values) ++bits;
  return bits;
}

// Steps 4-6 of splat_project with tile keys of type Key: emit the pairs into `values` and a
// key buffer, sort them (into `values` or `values_alt`: returned), write the tile ranges. The
// keys and the sort's scratch are freed on return.
template <typename Key>
const int32_t* bin(const at::TensorOptions& binning, const at::Tensor& counts,
                   const at::Tensor& order, const int64_t* offsets, const int4* rects, int n,
                   int tiles_x, int64_t total, int end_bit, size_t sort_bytes,
                   at::Tensor& values, at::Tensor& values_alt, at::Tensor& ranges,
                   cudaStream_t stream) {
  static_assert(sizeof(Key) == 2 || sizeof(Key) == 4, "16-bit or 32-bit tile keys");
  const at::Tensor keys =
      at::empty({2 * total}, binning.dtype(sizeof(Key) == 2 ? at::kShort : at::kInt));
  Key* keys_ptr = static_cast<Key*>(keys.data_ptr());
  launch_emit<Key>(counts.const_data_ptr<int64_t>(), order.const_data_ptr<int32_t>(), offsets,
                   rects, n, tiles_x, keys_ptr, values.data_ptr<int32_t>(), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(sort_bytes, 1))},
                                    binning.dtype(at::kByte));
  Key* sorted_keys = nullptr;
  int32_t* sorted = nullptr;
  C10_CUDA_CHECK(sort_pairs<Key>(temp.data_ptr(), sort_bytes, keys_ptr, keys_ptr + total,
                                 values.data_ptr<int32_t>(), values_alt.data_ptr<int32_t>(),
                                 static_cast<int>(total), end_bit, &sorted_keys, &sorted,
                                 stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  launch_ranges<Key>(sorted_keys, static_cast<int>(total),
                     reinterpret_cast<int2*>(ranges.data_ptr<int32_t>()), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return sorted;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor>
splat_project_cuda(
    // the Gaussian parameters: all float32, all bfloat16 or all float16
    const at::Tensor& means,       // [N, 3] world space
    const at::Tensor& scales,      // [N, 3] > 0 (activated)
    const at::Tensor& rotations,   // [N, 4] wxyz, unnormalized
    const at::Tensor& opacities,   // [N] in [0, 1] (activated)
    const at::Tensor& colors,      // [N, 3] RGB (sh_degree -1) or SH [N, K, 3]
    const at::Tensor& viewmat,     // [4, 4] float32, world -> camera
    const at::Tensor& K,           // [3, 3] float32, pinhole intrinsics
    const at::Tensor& background,  // [3], the parameters' dtype
    int64_t width, int64_t height, int64_t sh_degree, std::optional<int64_t> max_bytes) {
  // The guard needs a CUDA device, so this one check comes first.
  check_cuda(means, kOp, "means");
#ifdef GPUCHECK_DEFECT_BUFFERS_CURRENT_DEVICE
  // Defect (selftest; the original 3DGS rasterizer's): the binning buffers are allocated for
  // the caller's current device, read before the guard, not for the input's.
  const at::Device caller(at::kCUDA, c10::cuda::current_device());
#endif
  GPUCHECK_DEVICE_GUARD(means);
  const Scalar scalar = parameter_scalar(means, kOp);
  const at::ScalarType dt = means.scalar_type();
  const bool half = scalar != Scalar::kFloat32;
  const std::string like = same_dtype_as_means(means);
  check_input(means, means, "means", {-1, 3}, kOp, dt);
  const int64_t n64 = means.size(0);
  check_input(means, scales, "scales", {n64, 3}, kOp, dt, "means", like);
  check_input(means, rotations, "rotations", {n64, 4}, kOp, dt, "means", like);
  check_input(means, opacities, "opacities", {n64}, kOp, dt, "means", like);
  check_input(means, viewmat, "viewmat", {4, 4}, kOp, at::kFloat, "means", kCameraDtype);
  check_input(means, K, "K", {3, 3}, kOp, at::kFloat, "means", kCameraDtype);
  check_input(means, background, "background", {3}, kOp, dt, "means", like);
  TORCH_CHECK_VALUE(sh_degree >= -1 && sh_degree <= kMaxShDegree, kOp,
                    ": sh_degree must be -1 (colors are RGB) or in 0..", kMaxShDegree, ", got ",
                    sh_degree);
  int64_t sh_coeffs = 0;
  if (sh_degree < 0) {
    check_input(means, colors, "colors", {n64, 3}, kOp, dt, "means", like);
  } else {
    check_input(means, colors, "sh", {n64, -1, 3}, kOp, dt, "means", like);
    sh_coeffs = colors.size(1);
    TORCH_CHECK_VALUE(sh_coeffs >= (sh_degree + 1) * (sh_degree + 1), kOp, ": sh_degree ",
                      sh_degree, " needs ", (sh_degree + 1) * (sh_degree + 1),
                      " coefficients per channel, got sh of shape ", colors.sizes());
  }
  TORCH_CHECK_VALUE(width >= 1 && width <= kMaxImageSide && height >= 1 &&
                        height <= kMaxImageSide,
                    kOp, ": width and height must be in [1, ", kMaxImageSide, "], got ", width,
                    "x", height);
  TORCH_CHECK_VALUE(!max_bytes.has_value() || *max_bytes >= 0, kOp,
                    ": max_bytes must be None or >= 0, got ", max_bytes.value_or(0));
  TORCH_CHECK_VALUE(n64 < kNone, kOp, ": at most ", kNone - 1, " Gaussians are supported, got ",
                    n64);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // every output is float32 or int32, whatever the parameters' dtype
  const auto options = means.options().dtype(at::kFloat);
  const int tiles_x = static_cast<int>((width + kTileSize - 1) / kTileSize);
  const int tiles_y = static_cast<int>((height + kTileSize - 1) / kTileSize);
  const int64_t tiles = int64_t{tiles_x} * tiles_y;
  at::Tensor means2d = at::empty({n64, 2}, options);
  at::Tensor conics = at::empty({n64, 3}, options);
  at::Tensor rgb = at::empty({n64, 3}, options);
  at::Tensor depths = at::empty({n64}, options);
  at::Tensor radii = at::empty({n64}, options.dtype(at::kInt));
  at::Tensor rects = at::empty({n64, 4}, options.dtype(at::kInt));
  at::Tensor ranges = at::zeros({tiles, 2}, options.dtype(at::kInt));
  // 16-bit parameters: float32 copies of the opacities and the background for render (float32
  // only), written by preprocess; [0] for float32 parameters (render takes those themselves)
  at::Tensor render_opacities = at::empty({half ? n64 : 0}, options);
  at::Tensor render_background = at::empty({half ? 3 : 0}, options);
  if (n64 == 0) {
    if (half) render_background = background.to(at::kFloat);
    return {means2d, conics, rgb, depths, radii, rects, ranges,
            at::empty({0}, options.dtype(at::kInt)), render_opacities, render_background};
  }
  const int n = static_cast<int>(n64);

  // 1. preprocess. `info` holds the inclusive scan of the tile counts ([0, n)) followed by
  // the first bad row of each kind (int32, in the last 3 int64 slots), so that one small
  // device-to-host copy of info[n - 1:] brings both the total and the validation.
  at::Tensor counts = at::empty({n64}, options.dtype(at::kLong));
  at::Tensor info = at::empty({n64 + 3}, options.dtype(at::kLong));
  int64_t* offsets = info.data_ptr<int64_t>();
  auto* bad = reinterpret_cast<int32_t*>(offsets + n64);
  C10_CUDA_CHECK(cudaMemsetAsync(bad, 0x7F, 3 * sizeof(int64_t), stream));
  PreprocessArgs args{};
  args.scalar = scalar;
  args.means = means.const_data_ptr();
  args.scales = scales.const_data_ptr();
  args.rotations = rotations.const_data_ptr();
  args.opacities = opacities.const_data_ptr();
  args.colors = colors.const_data_ptr();
  args.viewmat = viewmat.const_data_ptr<float>();
  args.intrinsics = K.const_data_ptr<float>();
  args.background = background.const_data_ptr();
  args.n = n;
  args.sh_degree = static_cast<int>(sh_degree);
  args.sh_coeffs = static_cast<int>(sh_coeffs);
  args.width = static_cast<int>(width);
  args.height = static_cast<int>(height);
  args.tiles_x = tiles_x;
  args.tiles_y = tiles_y;
  args.radii = radii.data_ptr<int32_t>();
  args.counts = counts.data_ptr<int64_t>();
  args.rects = reinterpret_cast<int4*>(rects.data_ptr<int32_t>());
  args.means2d = reinterpret_cast<float2*>(means2d.data_ptr<float>());
  args.conics = conics.data_ptr<float>();
  args.rgb = rgb.data_ptr<float>();
  args.depths = depths.data_ptr<float>();
  args.bad = bad;
  args.opacities_f32 = half ? render_opacities.data_ptr<float>() : nullptr;
  args.background_f32 = half ? render_background.data_ptr<float>() : nullptr;
  launch_preprocess(args, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  // 2. the Gaussians' order by depth (stable, so equal depths keep index order), and the
  // inclusive scan of their tile counts in that order; one read back (synchronises the
  // current stream).
  at::Tensor order = at::empty({n64}, options.dtype(at::kInt));
  {
    const size_t sort_bytes = depth_sort_temp_bytes(n);
    const size_t temp_bytes = std::max(sort_bytes, scan_temp_bytes(n));
    const at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                                      options.dtype(at::kByte));
    const at::Tensor scratch = at::empty({2 * n64}, options.dtype(at::kInt));
    auto* depth_keys = reinterpret_cast<uint32_t*>(scratch.data_ptr<int32_t>());
    C10_CUDA_CHECK(depth_sort(temp.data_ptr(), sort_bytes, args.depths, depth_keys,
                              scratch.data_ptr<int32_t>() + n64, order.data_ptr<int32_t>(), n,
                              stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const at::Tensor sorted_counts = at::empty({n64}, options.dtype(at::kLong));
    launch_gather_counts(args.counts, order.const_data_ptr<int32_t>(), n,
                         sorted_counts.data_ptr<int64_t>(), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    C10_CUDA_CHECK(inclusive_scan(temp.data_ptr(), temp_bytes,
                                  sorted_counts.const_data_ptr<int64_t>(), offsets, n, stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const at::Tensor host = info.narrow(0, n64 - 1, 4).to(at::kCPU);
  const int64_t total = host.const_data_ptr<int64_t>()[0];
  int32_t bad_host[kBadCount];
  std::memcpy(bad_host, host.const_data_ptr<int64_t>() + 1, sizeof(bad_host));
  raise_bad_input(bad_host, n64, means, scales, rotations, opacities, viewmat, K, background);

  // 3. preflight, before any binning buffer exists. Its host time shows in torch.profiler as
  // "gpucheck::splat_preflight" (benchmarks/splat.py --preflight measures its share). The
  // sort's scratch, which the sort needs sized in any case, is counted too; it can only be
  // sized for an int32 count: past that the keys alone are > 24 GiB, which is what the
  // comparison with the free memory then mostly sees. A max_bytes budget counts
  // kBytesPerIntersection (the reference's unit) a pair; the free memory what is allocated.
  const bool fits_int32 = total <= std::numeric_limits<int32_t>::max();
  const bool short_keys = tiles <= 65536;
  const int end_bit = std::max(1, bits_for(tiles));
  const int64_t pair_bytes = 2 * (short_keys ? 2 : 4) + 2 * 4;  // keys, values; double-buffered
  size_t sort_bytes = 0;
  if (total > 0 && fits_int32) {
    sort_bytes = short_keys ? sort_temp_bytes<uint16_t>(static_cast<int>(total), end_bit)
                            : sort_temp_bytes<uint32_t>(static_cast<int>(total), end_bit);
  }
  {
    RECORD_FUNCTION("gpucheck::splat_preflight", std::vector<c10::IValue>());
    const int64_t budget_bytes = total * kBytesPerIntersection;
    const int64_t needed = total * pair_bytes + static_cast<int64_t>(sort_bytes);
    const bool over_budget = max_bytes.has_value() && budget_bytes > *max_bytes;
    // Free: what the caching allocator holds unused (in a training loop, the last step's
    // binning buffers) plus what the driver reports; the driver is asked only when the cache
    // alone is short (or for the error's evidence), which saves the call in the steady state.
    int64_t available = cached_free_bytes(means.device().index());
    if (needed > available || over_budget || !fits_int32) available += driver_free_bytes();
    if (over_budget) {
      raise_budget("more than max_bytes " + std::to_string(*max_bytes), n64, total,
                   budget_bytes, available, radii, counts, tiles, width, height);
    }
    if (needed > available) {
      raise_budget("needs " + std::to_string(needed) + " bytes with the sort's scratch, more "
                   "than the " + std::to_string(available) + " bytes free on " +
                   means.device().str(), n64, total, needed, available, radii, counts, tiles,
                   width, height);
    }
    if (!fits_int32) {
      raise_budget("more than 2^31 - 1 Gaussian-tile overlaps, which the int32 sort cannot "
                   "hold", n64, total, needed, available, radii, counts, tiles, width, height);
    }
  }
  const int items = static_cast<int>(total);

  // 4. keys (tile ids, emitted in depth order), stable sort on the tile id, per-tile ranges.
  // The sorted Gaussian ids are returned for render and its backward.
  if (items == 0) {
    return {means2d, conics, rgb, depths, radii, rects, ranges,
            at::empty({0}, options.dtype(at::kInt)), render_opacities, render_background};
  }
#ifdef GPUCHECK_DEFECT_BUFFERS_CURRENT_DEVICE
  const auto binning = options.device(caller);
#else
  const auto binning = options;
#endif
  // two value tensors (not one of 2 * total): the one the sort ends in is returned as is
  at::Tensor values = at::empty({total}, binning.dtype(at::kInt));
  at::Tensor values_alt = at::empty({total}, binning.dtype(at::kInt));
  const int32_t* sorted = short_keys
      ? bin<uint16_t>(binning, counts, order, offsets, args.rects, n, tiles_x, total, end_bit,
                      sort_bytes, values, values_alt, ranges, stream)
      : bin<uint32_t>(binning, counts, order, offsets, args.rects, n, tiles_x, total, end_bit,
                      sort_bytes, values, values_alt, ranges, stream);
  return {means2d, conics, rgb, depths, radii, rects, ranges,
          sorted == values.const_data_ptr<int32_t>() ? values : values_alt, render_opacities,
          render_background};
}

namespace {

// The compositing inputs of render and render_backward, checked.
SplatInputs splat_inputs(const char* op, const at::Tensor& means2d, const at::Tensor& conics,
                         const at::Tensor& opacities, const at::Tensor& rgb,
                         const at::Tensor& depths, const at::Tensor& background,
                         const at::Tensor& tile_ranges, const at::Tensor& ids, int64_t width,
                         int64_t height) {
  check_input(means2d, means2d, "means2d", {-1, 2}, op, at::kFloat, "means2d");
  const int64_t n = means2d.size(0);
  check_input(means2d, conics, "conics", {n, 3}, op, at::kFloat, "means2d");
  check_input(means2d, opacities, "opacities", {n}, op, at::kFloat, "means2d");
  check_input(means2d, rgb, "rgb", {n, 3}, op, at::kFloat, "means2d");
  check_input(means2d, depths, "depths", {n}, op, at::kFloat, "means2d");
  check_input(means2d, background, "background", {3}, op, at::kFloat, "means2d");
  TORCH_CHECK_VALUE(width >= 1 && width <= kMaxImageSide && height >= 1 &&
                        height <= kMaxImageSide,
                    op, ": width and height must be in [1, ", kMaxImageSide, "], got ", width,
                    "x", height);
  SplatInputs in{};
  in.width = static_cast<int>(width);
  in.height = static_cast<int>(height);
  in.tiles_x = static_cast<int>((width + kTileSize - 1) / kTileSize);
  in.tiles_y = static_cast<int>((height + kTileSize - 1) / kTileSize);
  check_input(means2d, tile_ranges, "tile_ranges", {int64_t{in.tiles_x} * in.tiles_y, 2}, op,
              at::kInt, "means2d");
  check_input(means2d, ids, "ids", {-1}, op, at::kInt, "means2d");
  in.ranges = reinterpret_cast<const int2*>(tile_ranges.const_data_ptr<int32_t>());
  in.ids = ids.const_data_ptr<int32_t>();
  in.means2d = reinterpret_cast<const float2*>(means2d.const_data_ptr<float>());
  in.conics = conics.const_data_ptr<float>();
  in.opacities = opacities.const_data_ptr<float>();
  in.rgb = rgb.const_data_ptr<float>();
  in.depths = depths.const_data_ptr<float>();
  in.background = background.const_data_ptr<float>();
  return in;
}

// Pixels each thread of the render backward walks: kBackwardPixels, or
// GPUCHECK_SPLAT_BACKWARD_PIXELS (2 or 4; tuning and tests).
int backward_pixels(const char* op) {
  const char* env = std::getenv("GPUCHECK_SPLAT_BACKWARD_PIXELS");
  if (env == nullptr || *env == '\0') return kBackwardPixels;
  TORCH_CHECK_VALUE(std::strcmp(env, "2") == 0 || std::strcmp(env, "4") == 0, op,
                    ": GPUCHECK_SPLAT_BACKWARD_PIXELS must be 2 or 4, got '", env, "'");
  return env[0] - '0';
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> splat_render_cuda(
    const at::Tensor& means2d,      // [N, 2] float32, pixel-space means (from splat_project)
    const at::Tensor& conics,       // [N, 3] float32
    const at::Tensor& opacities,    // [N] float32, in [0, 1]
    const at::Tensor& rgb,          // [N, 3] float32
    const at::Tensor& depths,       // [N] float32
    const at::Tensor& background,   // [3] float32
    const at::Tensor& tile_ranges,  // [tiles, 2] int32 (from splat_project)
    const at::Tensor& ids,          // [overlaps] int32 (from splat_project)
    int64_t width, int64_t height) {
  constexpr const char* op = "splat_render";
  check_cuda(means2d, op, "means2d");
  GPUCHECK_DEVICE_GUARD(means2d);
  const SplatInputs in = splat_inputs(op, means2d, conics, opacities, rgb, depths, background,
                                      tile_ranges, ids, width, height);
  const auto options = means2d.options();
  at::Tensor image = at::empty({3, height, width}, options);
  at::Tensor alpha = at::empty({height, width}, options);
  at::Tensor depth = at::empty({height, width}, options);
  at::Tensor final_T = at::empty({height, width}, options);
  at::Tensor n_contrib = at::empty({height, width}, options.dtype(at::kInt));
  // tiles without Gaussians write the background (an empty range, whatever the ids)
  launch_render(in, image.data_ptr<float>(), alpha.data_ptr<float>(), depth.data_ptr<float>(),
                final_T.data_ptr<float>(), n_contrib.data_ptr<int32_t>(),
                c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {image, alpha, depth, final_T, n_contrib};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
splat_render_backward_cuda(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& opacities,
    const at::Tensor& rgb, const at::Tensor& depths, const at::Tensor& background,
    const at::Tensor& tile_ranges, const at::Tensor& ids,  // as splat_render's inputs
    const at::Tensor& alpha,       // [H, W] float32, splat_render's output
    const at::Tensor& depth,       // [H, W] float32, splat_render's output
    const at::Tensor& final_T,     // [H, W] float32, splat_render's output
    const at::Tensor& n_contrib,   // [H, W] int32, splat_render's output
    const at::Tensor& grad_image,  // [3, H, W] float32
    const at::Tensor& grad_alpha,  // [H, W] float32, or [0]: the loss does not use alpha
    const at::Tensor& grad_depth,  // [H, W] float32, or [0]: the loss does not use depth
    int64_t width, int64_t height) {
  constexpr const char* op = "splat_render_backward";
  check_cuda(means2d, op, "means2d");
  GPUCHECK_DEVICE_GUARD(means2d);
  const SplatInputs in = splat_inputs(op, means2d, conics, opacities, rgb, depths, background,
                                      tile_ranges, ids, width, height);
  check_input(means2d, alpha, "alpha", {height, width}, op, at::kFloat, "means2d");
  check_input(means2d, depth, "depth", {height, width}, op, at::kFloat, "means2d");
  check_input(means2d, final_T, "final_T", {height, width}, op, at::kFloat, "means2d");
  check_input(means2d, n_contrib, "n_contrib", {height, width}, op, at::kInt, "means2d");
  check_input(means2d, grad_image, "grad_image", {3, height, width}, op, at::kFloat, "means2d");
  // grad_alpha / grad_depth: [H, W], or empty ([0]) where the loss does not use that output
  // (no zero planes: 8 bytes a pixel less at the backward's peak)
  const auto optional_plane = [&](const at::Tensor& t, const char* name) -> const float* {
    if (t.numel() == 0) {
      check_input(means2d, t, name, {0}, op, at::kFloat, "means2d");
      return nullptr;
    }
    check_input(means2d, t, name, {height, width}, op, at::kFloat, "means2d");
    return t.const_data_ptr<float>();
  };
  const float* grad_alpha_ptr = optional_plane(grad_alpha, "grad_alpha");
  const float* grad_depth_ptr = optional_plane(grad_depth, "grad_depth");
  const int pixels_per_thread = backward_pixels(op);
  const int64_t n = means2d.size(0);
  const auto options = means2d.options();
  at::Tensor g_means2d = at::zeros({n, 2}, options);
  at::Tensor g_conics = at::zeros({n, 3}, options);
  at::Tensor g_opacities = at::zeros({n}, options);
  at::Tensor g_rgb = at::zeros({n, 3}, options);
  at::Tensor g_depths = at::zeros({n}, options);
  if (n == 0 || ids.numel() == 0) return {g_means2d, g_conics, g_opacities, g_rgb, g_depths};
  RenderGrads g{};
  g.alpha = alpha.const_data_ptr<float>();
  g.depth = depth.const_data_ptr<float>();
  g.final_T = final_T.const_data_ptr<float>();
  g.n_contrib = n_contrib.const_data_ptr<int32_t>();
  g.grad_image = grad_image.const_data_ptr<float>();
  g.grad_alpha = grad_alpha_ptr;
  g.grad_depth = grad_depth_ptr;
  g.g_means2d = reinterpret_cast<float2*>(g_means2d.data_ptr<float>());
  g.g_conics = g_conics.data_ptr<float>();
  g.g_opacities = g_opacities.data_ptr<float>();
  g.g_rgb = g_rgb.data_ptr<float>();
  g.g_depths = g_depths.data_ptr<float>();
  launch_render_backward(in, g, pixels_per_thread, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {g_means2d, g_conics, g_opacities, g_rgb, g_depths};
}

// The schemas of its ops (splat_project_backward's: in splat_project_backward.cpp).
GPUCHECK_TORCH_LIBRARY_FRAGMENT(m) {
  // splat_project: per Gaussian projection, colour (colors: [N, 3] RGB with sh_degree -1, or
  // SH [N, K, 3] with sh_degree 0..3), validation, memory preflight and tile binning. The
  // Gaussian parameters are float32, bfloat16 or float16 (one dtype), viewmat and K float32;
  // every output float32 / int32. render_opacities / render_background: with 16-bit
  // parameters their float32 copies, which splat_render takes; [0] for float32 parameters.
  m.def(
      "splat_project(Tensor means, Tensor scales, Tensor rotations, Tensor opacities, "
      "Tensor colors, Tensor viewmat, Tensor K, Tensor background, int width, int height, "
      "int sh_degree, int? max_bytes=None) -> (Tensor means2d, Tensor conics, Tensor rgb, "
      "Tensor depths, Tensor radii, Tensor tiles, Tensor tile_ranges, Tensor ids, "
      "Tensor render_opacities, Tensor render_background)");
  // splat_render: per tile compositing of what splat_project returned.
  m.def(
      "splat_render(Tensor means2d, Tensor conics, Tensor opacities, Tensor rgb, "
      "Tensor depths, Tensor background, Tensor tile_ranges, Tensor ids, int width, "
      "int height) -> (Tensor image, Tensor alpha, Tensor depth, Tensor final_T, "
      "Tensor n_contrib)");
  // Float atomics sum the per-Gaussian gradients in an order that varies between runs: the
  // tag tells gpucheck's numerics detector (and torch) that its bits may differ.
  m.def(
      static_cast<const char*>(
      "splat_render_backward(Tensor means2d, Tensor conics, Tensor opacities, Tensor rgb, "
      "Tensor depths, Tensor background, Tensor tile_ranges, Tensor ids, Tensor alpha, "
      "Tensor depth, Tensor final_T, Tensor n_contrib, Tensor grad_image, Tensor grad_alpha, "
      "Tensor grad_depth, int width, int height) -> (Tensor grad_means2d, Tensor grad_conics, "
      "Tensor grad_opacities, Tensor grad_rgb, Tensor grad_depths)"),
      {at::Tag::nondeterministic_bitwise});
}

// Through the macro (library.h): a defect build registers under its own namespace, never over
// the real extension's kernels in the same process.
GPUCHECK_TORCH_LIBRARY_IMPL(CUDA, m) {
  m.impl("splat_project", &splat_project_cuda);
  m.impl("splat_render", &splat_render_cuda);
  m.impl("splat_render_backward", &splat_render_backward_cuda);
}

}  // namespace gpucheck::splat
