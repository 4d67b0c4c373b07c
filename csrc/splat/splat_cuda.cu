// Tile-based 3D Gaussian splatting rasterizer, forward pass: kernels and launchers.
//
// Pipeline (splat.cpp drives it; every step on the current stream):
//  1. preprocess: one thread per Gaussian validates its inputs (first bad row per kind, with
//     atomicMin), projects it with the view matrix and pinhole intrinsics, builds the 2D
//     covariance (EWA with the 0.3 px low-pass), the 3-sigma radius and the 16x16 tile
//     rectangle, and evaluates its colour (SH degree 0-3 or RGB). All of this in float64 from
//     the float32 inputs, like the float64 reference, so that radii and tile rectangles agree
//     with it exactly (but for values within rounding of an integer); the compositing data are
//     stored as float32.
//  2. scan: inclusive sum of the tiles each Gaussian touches (int64: a scene whose Gaussians
//     were activated twice can touch more than 2^31 tiles, and the entry point must be able to
//     say so before it allocates anything for them).
//  3. emit: one key (tile id << 32 | float bits of the depth) and value (Gaussian index) per
//     Gaussian-tile overlap. Depths are > 0.2, so their bit patterns sort like the floats.
//  4. sort: cub's stable radix sort over the key bits in use; equal keys keep index order.
//  5. ranges: the first and last sorted position of each tile.
//  6. render: one 16x16 block per tile; the tile's Gaussians are staged through shared memory
//     256 at a time and each thread composites its pixel front to back, stopping when its
//     transmittance would fall below 1e-4; the block leaves when all its pixels are done.
//
// Determinism: every step is a fixed sequence of operations per element (no floating-point
// atomics), so a scene renders to the same bits on every run.
#include "splat/splat.h"

#include <cub/cub.cuh>

#include <cmath>
#include <cstdint>

namespace gpucheck::splat {
namespace {

constexpr int kThreads = 256;

// Real SH constants (gpucheck/reference/splat_sh.py).
constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;
// (scalars, not arrays: constexpr arrays are not visible in device code)
constexpr double kC2a = 1.0925484305920792;   // sqrt(15) / (2 sqrt(pi))
constexpr double kC2b = 0.31539156525252005;  // sqrt(5) / (4 sqrt(pi))
constexpr double kC2c = 0.5462742152960396;   // sqrt(15) / (4 sqrt(pi))
constexpr double kC3a = 0.5900435899266435;   // sqrt(70) / (8 sqrt(pi))
constexpr double kC3b = 2.890611442640554;    // sqrt(105) / (2 sqrt(pi))
constexpr double kC3c = 0.4570457994644658;   // sqrt(42) / (8 sqrt(pi))
constexpr double kC3d = 0.3731763325901154;   // sqrt(7) / (4 sqrt(pi))
constexpr double kC3e = 1.445305721320277;    // sqrt(105) / (4 sqrt(pi))

__device__ __forceinline__ bool finite(float v) { return isfinite(v); }

// viewmat [4, 4] with bottom row 0 0 0 1, K [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] with
// fx, fy > 0, a finite background: as the reference requires.
__device__ bool camera_ok(const PreprocessArgs& a) {
  bool ok = true;
  for (int k = 0; k < 16; ++k) ok = ok && finite(a.viewmat[k]);
  for (int k = 0; k < 9; ++k) ok = ok && finite(a.intrinsics[k]);
  for (int k = 0; k < 3; ++k) ok = ok && finite(a.background[k]);
  if (!ok) return false;
  const float* v = a.viewmat;
  const float* K = a.intrinsics;
  return v[12] == 0.0f && v[13] == 0.0f && v[14] == 0.0f && v[15] == 1.0f && K[0] > 0.0f &&
         K[1] == 0.0f && K[3] == 0.0f && K[4] > 0.0f && K[6] == 0.0f && K[7] == 0.0f &&
         K[8] == 1.0f;
}

// RGB of the SH coefficients `c` ([coeffs, 3]) seen along unit direction (x, y, z).
__device__ void sh_color(const float* c, int degree, double x, double y, double z,
                         double rgb[3]) {
  double basis[16];
  basis[0] = kC0;
  int count = 1;
  if (degree >= 1) {
    basis[1] = -kC1 * y;
    basis[2] = kC1 * z;
    basis[3] = -kC1 * x;
    count = 4;
  }
  if (degree >= 2) {
    const double xx = x * x, yy = y * y, zz = z * z;
    basis[4] = kC2a * x * y;
    basis[5] = -kC2a * y * z;
    basis[6] = kC2b * (2.0 * zz - xx - yy);
    basis[7] = -kC2a * x * z;
    basis[8] = kC2c * (xx - yy);
    count = 9;
    if (degree >= 3) {
      basis[9] = -kC3a * y * (3.0 * xx - yy);
      basis[10] = kC3b * x * y * z;
      basis[11] = -kC3c * y * (4.0 * zz - xx - yy);
      basis[12] = kC3d * z * (2.0 * zz - 3.0 * xx - 3.0 * yy);
      basis[13] = -kC3c * x * (4.0 * zz - xx - yy);
      basis[14] = kC3e * z * (xx - yy);
      basis[15] = -kC3a * x * (xx - 3.0 * yy);
      count = 16;
    }
  }
  for (int ch = 0; ch < 3; ++ch) {
    double s = 0.0;
    for (int k = 0; k < count; ++k) s += basis[k] * static_cast<double>(c[3 * k + ch]);
    rgb[ch] = fmax(s + 0.5, 0.0);
  }
}

__global__ void __launch_bounds__(kThreads) preprocess_kernel(const PreprocessArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0 && !camera_ok(a)) atomicMin(&a.bad[kBadCamera], 0);
  if (i >= a.n) return;
  a.radii[i] = 0;
  a.counts[i] = 0;
  a.rects[i] = make_int4(0, 0, 0, 0);

  // --- validation (the reference's checks, without a host round trip) ---
  const float* mp = a.means + 3 * static_cast<int64_t>(i);
  const float* sp = a.scales + 3 * static_cast<int64_t>(i);
  const float* qp = a.rotations + 4 * static_cast<int64_t>(i);
  const float opacity = a.opacities[i];
  const int color_values = a.sh_degree < 0 ? 3 : 3 * a.sh_coeffs;
  const float* cp = a.colors + static_cast<int64_t>(color_values) * i;
  bool all_finite = finite(opacity);
  for (int k = 0; k < 3; ++k) all_finite = all_finite && finite(mp[k]) && finite(sp[k]);
  for (int k = 0; k < 4; ++k) all_finite = all_finite && finite(qp[k]);
  for (int k = 0; k < color_values; ++k) all_finite = all_finite && finite(cp[k]);
  const bool scale_ok = sp[0] > 0.0f && sp[1] > 0.0f && sp[2] > 0.0f;
  const bool opacity_ok = opacity >= 0.0f && opacity <= 1.0f;
  const bool rotation_ok = qp[0] != 0.0f || qp[1] != 0.0f || qp[2] != 0.0f || qp[3] != 0.0f;
  if (!all_finite) atomicMin(&a.bad[kBadNonFinite], i);
  if (!scale_ok) atomicMin(&a.bad[kBadScale], i);
  if (!opacity_ok) atomicMin(&a.bad[kBadOpacity], i);
  if (!rotation_ok) atomicMin(&a.bad[kBadRotation], i);
  if (!(all_finite && scale_ok && opacity_ok && rotation_ok)) return;

  // --- world -> camera ---
  double W[3][3];
  double t[3];
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) W[r][c] = a.viewmat[4 * r + c];
    t[r] = a.viewmat[4 * r + 3];
  }
  const double m[3] = {mp[0], mp[1], mp[2]};
  double p[3];
  for (int r = 0; r < 3; ++r) p[r] = W[r][0] * m[0] + W[r][1] * m[1] + W[r][2] * m[2] + t[r];
  const double z = p[2];
  if (!(z > kNearPlane)) return;

  // --- projection and the EWA Jacobian (x/z, y/z clamped to 1.3x the half field of view) ---
  const double fx = a.intrinsics[0], cx = a.intrinsics[2];
  const double fy = a.intrinsics[4], cy = a.intrinsics[5];
  const double u = p[0] / z, v = p[1] / z;
  const double mx = fx * u + cx, my = fy * v + cy;
  const double margin_x = 0.3 * 0.5 * a.width / fx, margin_y = 0.3 * 0.5 * a.height / fy;
  const double uc = fmin(fmax(u, -cx / fx - margin_x), (a.width - cx) / fx + margin_x);
  const double vc = fmin(fmax(v, -cy / fy - margin_y), (a.height - cy) / fy + margin_y);
  // T = J W, J = [[fx / z, 0, -fx uc / z], [0, fy / z, -fy vc / z]]
  double T[2][3];
  for (int c = 0; c < 3; ++c) {
    T[0][c] = fx / z * W[0][c] + (-fx * uc / z) * W[2][c];
    T[1][c] = fy / z * W[1][c] + (-fy * vc / z) * W[2][c];
  }

  // --- 3D covariance R S S^T R^T from the normalized quaternion; 2D covariance (T R S)(.)^T ---
  const double qn = fmax(sqrt(static_cast<double>(qp[0]) * qp[0] + static_cast<double>(qp[1]) *
                              qp[1] + static_cast<double>(qp[2]) * qp[2] +
                              static_cast<double>(qp[3]) * qp[3]), 1e-12);
  const double qw = qp[0] / qn, qx = qp[1] / qn, qy = qp[2] / qn, qz = qp[3] / qn;
  const double R[3][3] = {
      {1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - qw * qz), 2 * (qx * qz + qw * qy)},
      {2 * (qx * qy + qw * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - qw * qx)},
      {2 * (qx * qz - qw * qy), 2 * (qy * qz + qw * qx), 1 - 2 * (qx * qx + qy * qy)}};
  double A[2][3];  // T R diag(s)
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      A[r][c] = (T[r][0] * R[0][c] + T[r][1] * R[1][c] + T[r][2] * R[2][c]) * sp[c];
    }
  }
  const double ca = A[0][0] * A[0][0] + A[0][1] * A[0][1] + A[0][2] * A[0][2] + kLowPass;
  const double cb = A[0][0] * A[1][0] + A[0][1] * A[1][1] + A[0][2] * A[1][2];
  const double cc = A[1][0] * A[1][0] + A[1][1] * A[1][1] + A[1][2] * A[1][2] + kLowPass;
  const double det = ca * cc - cb * cb;
  if (!(det > 0.0)) return;

  // --- radius (3 sigma of the larger eigenvalue) and tile rectangle ---
  const double mid = 0.5 * (ca + cc);
  const double lam = mid + sqrt(fmax(mid * mid - det, 0.1));
  const double radius = ceil(3.0 * sqrt(fmax(lam, 0.0)));
  const double gx = a.tiles_x, gy = a.tiles_y;
  const double x0 = fmin(fmax(floor((mx - radius) / kTileSize), 0.0), gx);
  const double y0 = fmin(fmax(floor((my - radius) / kTileSize), 0.0), gy);
  const double x1 = fmin(fmax(ceil((mx + radius) / kTileSize), 0.0), gx);
  const double y1 = fmin(fmax(ceil((my + radius) / kTileSize), 0.0), gy);
  if (!(radius > 0.0) || !(x1 > x0) || !(y1 > y0)) return;
  const int4 rect = make_int4(static_cast<int>(x0), static_cast<int>(y0), static_cast<int>(x1),
                              static_cast<int>(y1));
  a.radii[i] = static_cast<int32_t>(fmin(radius, 2147483647.0));
  a.counts[i] = static_cast<int64_t>(rect.z - rect.x) * (rect.w - rect.y);
  a.rects[i] = rect;

  // --- colour ---
  double rgb[3];
  if (a.sh_degree < 0) {
    for (int ch = 0; ch < 3; ++ch) rgb[ch] = cp[ch];
  } else {
    // camera centre -W^T t; direction from it to the mean, normalized as F.normalize does
    double d[3];
    for (int c = 0; c < 3; ++c) d[c] = m[c] + (W[0][c] * t[0] + W[1][c] * t[1] + W[2][c] * t[2]);
    const double dn = fmax(sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), 1e-12);
    sh_color(cp, a.sh_degree, d[0] / dn, d[1] / dn, d[2] / dn, rgb);
  }

  a.xy[i] = make_float2(static_cast<float>(mx), static_cast<float>(my));
  a.conic_opacity[i] = make_float4(static_cast<float>(cc / det), static_cast<float>(-cb / det),
                                   static_cast<float>(ca / det), opacity);
  a.color_depth[i] = make_float4(static_cast<float>(rgb[0]), static_cast<float>(rgb[1]),
                                 static_cast<float>(rgb[2]), static_cast<float>(z));
}

__global__ void __launch_bounds__(kThreads)
    emit_kernel(const int64_t* __restrict__ counts, const int64_t* __restrict__ offsets,
                const int4* __restrict__ rects, const float4* __restrict__ color_depth, int n,
                int tiles_x, uint64_t* __restrict__ keys, int32_t* __restrict__ values) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t count = counts[i];
  if (count == 0) return;
  int64_t out = offsets[i] - count;
  const int4 r = rects[i];
  const uint64_t depth_bits = __float_as_uint(color_depth[i].w);
  for (int y = r.y; y < r.w; ++y) {
    for (int x = r.x; x < r.z; ++x) {
      const uint64_t tile = static_cast<uint64_t>(y) * tiles_x + x;
      keys[out] = (tile << 32) | depth_bits;
      values[out] = i;
      ++out;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    ranges_kernel(const uint64_t* __restrict__ keys, int items, int2* __restrict__ ranges) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= items) return;
  const uint32_t tile = static_cast<uint32_t>(keys[k] >> 32);
  if (k == 0) {
    ranges[tile].x = 0;
  } else {
    const uint32_t prev = static_cast<uint32_t>(keys[k - 1] >> 32);
    if (prev != tile) {
      ranges[prev].y = k;
      ranges[tile].x = k;
    }
  }
  if (k == items - 1) ranges[tile].y = items;
}

__global__ void __launch_bounds__(kBlockPixels)
    render_kernel(const int2* __restrict__ ranges, const int32_t* __restrict__ values,
                  const float2* __restrict__ xy, const float4* __restrict__ conic_opacity,
                  const float4* __restrict__ color_depth, const float* __restrict__ background,
                  int width, int height, int tiles_x, float* __restrict__ image,
                  float* __restrict__ alpha_out, float* __restrict__ depth_out) {
  __shared__ float2 s_xy[kBlockPixels];
  __shared__ float4 s_conic[kBlockPixels];
  __shared__ float4 s_color[kBlockPixels];

  const int tid = threadIdx.x;
  const int px = blockIdx.x * kTileSize + tid % kTileSize;
  const int py = blockIdx.y * kTileSize + tid / kTileSize;
  const bool inside = px < width && py < height;
  const float cx = static_cast<float>(px) + 0.5f;
  const float cy = static_cast<float>(py) + 0.5f;
  const int2 range = ranges[blockIdx.y * tiles_x + blockIdx.x];

  float T = 1.0f;
  float rgb[3] = {0.0f, 0.0f, 0.0f};
  float depth = 0.0f;
  bool done = !inside;
  for (int start = range.x; start < range.y; start += kBlockPixels) {
    // Also the barrier that protects the previous batch in shared memory.
    if (__syncthreads_count(done) == kBlockPixels) break;
    const int k = start + tid;
    if (k < range.y) {
      const int g = values[k];
      s_xy[tid] = xy[g];
      s_conic[tid] = conic_opacity[g];
      s_color[tid] = color_depth[g];
    }
    __syncthreads();
    const int batch = min(kBlockPixels, range.y - start);
    for (int j = 0; !done && j < batch; ++j) {
      const float2 m = s_xy[j];
      const float4 co = s_conic[j];
      const float dx = m.x - cx;
      const float dy = m.y - cy;
      const float power = -0.5f * (co.x * dx * dx + co.z * dy * dy) - co.y * dx * dy;
      if (!(power <= 0.0f)) continue;
      const float a = fminf(kAlphaMax, co.w * expf(power));
      if (a < kAlphaMin) continue;
      const float next_T = T * (1.0f - a);
      if (next_T < kTransmittanceMin) {
        done = true;
        break;
      }
      const float4 cd = s_color[j];
      const float w = a * T;
      rgb[0] += cd.x * w;
      rgb[1] += cd.y * w;
      rgb[2] += cd.z * w;
      depth += cd.w * w;
      T = next_T;
    }
  }
  if (!inside) return;
  const int64_t plane = static_cast<int64_t>(width) * height;
  const int64_t pix = static_cast<int64_t>(py) * width + px;
  for (int ch = 0; ch < 3; ++ch) image[ch * plane + pix] = rgb[ch] + T * background[ch];
  const float acc = 1.0f - T;
  alpha_out[pix] = acc;
  depth_out[pix] = acc > 0.0f ? depth / acc : 0.0f;
}

int blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

}  // namespace

void launch_preprocess(const PreprocessArgs& args, cudaStream_t stream) {
  preprocess_kernel<<<blocks(args.n), kThreads, 0, stream>>>(args);
}

size_t scan_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                static_cast<int64_t*>(nullptr), n);
  return bytes;
}

cudaError_t inclusive_scan(void* temp, size_t temp_bytes, const int64_t* counts,
                           int64_t* offsets, int n, cudaStream_t stream) {
  return cub::DeviceScan::InclusiveSum(temp, temp_bytes, counts, offsets, n, stream);
}

void launch_emit(const int64_t* counts, const int64_t* offsets, const int4* rects,
                 const float4* color_depth, int n, int tiles_x, uint64_t* keys,
                 int32_t* values, cudaStream_t stream) {
  emit_kernel<<<blocks(n), kThreads, 0, stream>>>(counts, offsets, rects, color_depth, n,
                                                    tiles_x, keys, values);
}

size_t sort_temp_bytes(int items, int end_bit) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, items, 0, end_bit);
  return bytes;
}

cudaError_t sort_pairs(void* temp, size_t temp_bytes, uint64_t* keys, uint64_t* keys_alt,
                       int32_t* values, int32_t* values_alt, int items, int end_bit,
                       uint64_t** keys_out, int32_t** values_out, cudaStream_t stream) {
  cub::DoubleBuffer<uint64_t> k(keys, keys_alt);
  cub::DoubleBuffer<int32_t> v(values, values_alt);
  const cudaError_t err =
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k, v, items, 0, end_bit, stream);
  *keys_out = k.Current();
  *values_out = v.Current();
  return err;
}

void launch_ranges(const uint64_t* sorted_keys, int items, int2* ranges, cudaStream_t stream) {
  ranges_kernel<<<blocks(items), kThreads, 0, stream>>>(sorted_keys, items, ranges);
}

void launch_render(const int2* ranges, const int32_t* sorted_values, const float2* xy,
                   const float4* conic_opacity, const float4* color_depth,
                   const float* background, int width, int height, int tiles_x, int tiles_y,
                   float* image, float* alpha, float* depth, cudaStream_t stream) {
  const dim3 grid(tiles_x, tiles_y);
  render_kernel<<<grid, kBlockPixels, 0, stream>>>(ranges, sorted_values, xy, conic_opacity,
                                                   color_depth, background, width, height,
                                                   tiles_x, image, alpha, depth);
}

}  // namespace gpucheck::splat
