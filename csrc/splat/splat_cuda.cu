// Tile-based 3D Gaussian splatting rasterizer, forward pass: kernels and launchers.
//
// Pipeline (splat.cpp drives it; every step on the current stream):
//  1. preprocess: one thread per Gaussian validates its inputs (first bad row per kind, with
//     atomicMin), projects it with the view matrix and pinhole intrinsics, builds the 2D
//     covariance (EWA with the 0.3 px low-pass), the 3-sigma radius and the 16x16 tile
//     rectangle (the radius's square intersected with the opacity-aware box where alpha can
//     still reach 1/255: tile_box), and evaluates its colour (SH degree 0-3 or RGB). All of
//     this in float64 from the inputs, like the float64 reference, so that radii and tile
//     rectangles agree with it exactly (but for values within rounding of an integer); the
//     compositing data are stored as float32. The Gaussian parameters are float32, bfloat16
//     or float16 (a template on the type: read as such and converted exactly, no copy
//     kernel); the same values give the same bits whatever their storage type. With 16-bit
//     parameters it also writes float32 copies of the opacities and the background, which
//     render (float32 only) reads. Each input is read once (the colour row 4 values at a time
//     where it can be: colour_row) and each output written once; 120 registers, no spills
//     (capping them at 80 for a third block per SM spills and was not kept).
//  2. depth order: cub's stable radix sort of the Gaussians' depth bits (depths > 0.2 sort
//     like their bit patterns), values the indices, so equal depths keep index order.
//  3. scan: inclusive sum of the tiles each Gaussian touches, in depth order (int64: a scene
//     whose Gaussians were activated twice can touch more than 2^31 tiles, and the entry
//     point must be able to say so before it allocates anything for them).
//  4. emit: one key (the tile id, 16 bits up to 65536 tiles, else 32) and value (Gaussian
//     index) per Gaussian-tile overlap, Gaussian by Gaussian in depth order.
//  5. sort: cub's stable radix sort over the tile id's bits (13 at 1920x1080: 2 passes; the
//     64-bit tile << 32 | depth key this replaces took 6 passes over 24 bytes a pair, this
//     takes 2 over 6 or 8), so each tile's Gaussians stay front to back, equal depths in
//     index order: the order the 64-bit key gave.
//  6. ranges: the first and last sorted position of each tile.
//  7. render: one 16x16 block per tile; the tile's Gaussians are staged through shared memory
//     256 at a time and each thread composites its pixel front to back, stopping when its
//     transmittance would fall below 1e-4; the block leaves when all its pixels are done.
//     The exponent with fmas and exp by ex2.approx (gaussian_power, gaussian_exp in
//     splat_device.cuh: 8 operations and ex2 a pixel, where the exponent without fmas and
//     expf took 11 and 9), bit for bit what the backward forms; a staged Gaussian is one
//     struct (one base address for an iteration's loads, not three rebuilt every iteration).
//     The inner loop: 39 instructions a composited Gaussian, 17 one whose exponent is > 0
//     (were 56 and 27).
//     (Warps of 8x4 pixels that pass over the Gaussians whose reach misses them were tried:
//     slower, HISTORY.md "Splatting training step 1.5x gsplat".)
//     Each pixel keeps its final transmittance and the list position of its last
//     contribution for the backward pass (splat_backward.cu).
// Steps 1-6 are the `project` op, step 7 the `render` op (splat.cpp).
//
// Determinism: every step is a fixed sequence of operations per element (no floating-point
// atomics), so a scene renders to the same bits on every run.
#include "splat/splat.h"
#include "splat/splat_device.cuh"

#include <cub/cub.cuh>

#include <cmath>
#include <cstdint>

namespace gpucheck::splat {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool finite(float v) { return isfinite(v); }

// viewmat [4, 4] with bottom row 0 0 0 1, K [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] with
// fx, fy > 0, a finite background: as the reference requires.
template <typename T>
__device__ bool camera_ok(const PreprocessArgs& a) {
  const T* background = static_cast<const T*>(a.background);
  bool ok = true;
  for (int k = 0; k < 16; ++k) ok = ok && finite(a.viewmat[k]);
  for (int k = 0; k < 9; ++k) ok = ok && finite(a.intrinsics[k]);
  for (int k = 0; k < 3; ++k) ok = ok && finite(to_float(background[k]));
  if (!ok) return false;
  const float* v = a.viewmat;
  const float* K = a.intrinsics;
  return v[12] == 0.0f && v[13] == 0.0f && v[14] == 0.0f && v[15] == 1.0f && K[0] > 0.0f &&
         K[1] == 0.0f && K[3] == 0.0f && K[4] > 0.0f && K[6] == 0.0f && K[7] == 0.0f &&
         K[8] == 1.0f;
}

// Half extents (ex, ey), in pixels around the float64 screen mean (mx, my), of the box outside
// which render_kernel never composites the Gaussian; false when it composites it nowhere.
// Sxx = ca, Syy = cc, det: the 2D covariance S (low-pass included) whose inverse is the conic.
//
// In exact arithmetic render_kernel composites at pixel centre c only if opacity *
// exp(-q / 2) >= 1/255, q = d^T S^-1 d, d = mean - c; i.e. q <= t = 2 ln(255 opacity) (at most
// 2 ln 255 = 11.1). Nowhere when opacity < 1/255 (q >= 0); else only inside the bounding box
// of the ellipse q <= t: |dx| <= sqrt(t Sxx), |dy| <= sqrt(t Syy).
// The margins make that hold for the float32 render too, so the tiles the box drops held no
// pixel the Gaussian reached, and image, alpha, depth and gradients do not change. With
// u = 2^-24 and d now taken about the float32 mean:
//  * alpha = fl(opacity * G) >= fl(1/255) > 1/255 with G = ex2(fl(power fl(log2 e)))
//    (gaussian_exp in splat_device.cuh; ex2 within 2 ulp, the multiply and log2 e's rounding
//    2 u of the exponent, whose double is at most t <= 2 ln 255): -2 power <= t + 2^-19;
//  * each of the three terms of power (gaussian_power) carries at most 6 roundings (the
//    conic's, dx and dy, the products, the two fmas), so with [a b; b c] = S^-1 and
//    |2 b dx dy| <= a dx^2 + c dy^2: -2 power >= q - 12 u (a dx^2 + c dy^2). That quadratic
//    form <= t + 2^-19 has its box at sqrt(Sxx / (1 - 24 u k)) per unit of t along x (Syy
//    along y), k = Sxx Syy / det >= 1 (large for thin, tilted ellipses). kBoxSlackT = 2^-17
//    on t (4x) and kBoxSlackQuad = 2^-18 on k (2.7x 24 u) cover both, with room for the
//    float64 rounding of S, its inverse and this function (far smaller). (The exponent
//    without fmas and expf, before: 11 u and a rounding of the result, 22 u k: 2.9x.) Above
//    k = kBoxMaxSkew = 2^17 (an ellipse ~700 times longer than wide at 45 degrees) the
//    denominator could reach 0: the square alone is used;
//  * the render's mean is the float32 rounding of (mx, my), at most u |mx| away:
//    kBoxSlackMean = 2^-22 times |mx| on the extent covers it (4x) and the float64 rounding
//    of mx -+ ex.
// The reference (gpucheck/kernels/splat/reference.py) computes the same box in float64.
__device__ __forceinline__ bool tile_box(double ca, double cc, double det, double opacity,
                                         double mx, double my, double& ex, double& ey) {
  if (opacity < kOpacityMin) return false;
  const double skew = ca * cc / det;
  if (!(skew <= kBoxMaxSkew)) {
    ex = ey = INFINITY;
    return true;
  }
  const double t = 2.0 * log(255.0 * opacity);
  const double s = (t + kBoxSlackT) / (1.0 - kBoxSlackQuad * skew);
  ex = sqrt(s * ca) + kBoxSlackMean * fabs(mx);
  ey = sqrt(s * cc) + kBoxSlackMean * fabs(my);
  return true;
}

// What preprocess writes for one Gaussian besides its screen mean, depth and colour: radius,
// tiles touched, tile rectangle and conic, all 0 when it is culled.
struct Footprint {
  int32_t radius = 0;
  int64_t count = 0;
  int4 rect = make_int4(0, 0, 0, 0);
  float conic[3] = {0.0f, 0.0f, 0.0f};
};

__device__ __forceinline__ Footprint footprint(const PreprocessArgs& a, const CameraPoint& cam,
                                               const float* sp, const float* qp,
                                               float opacity, double mx, double my) {
  Footprint f;
  if (!cam.in_front) return f;

  // --- the EWA Jacobian T = J W (x/z, y/z clamped to 1.3x the half field of view) ---
  const EwaJacobian jac = ewa_jacobian(cam, a.width, a.height);
  const double(&T)[2][3] = jac.T;

  // --- 3D covariance R S S^T R^T from the normalized quaternion; 2D covariance (T R S)(.)^T ---
  double q[4];
  double R[3][3];
  quat_rotmat(qp, q, R);
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
  if (!(det > 0.0)) return f;

  // --- radius (3 sigma of the larger eigenvalue) and its square's tiles ---
  const double mid = 0.5 * (ca + cc);
  const double lam = mid + sqrt(fmax(mid * mid - det, 0.1));
  const double radius = ceil(3.0 * sqrt(fmax(lam, 0.0)));
  const double gx = a.tiles_x, gy = a.tiles_y;
  const double x0 = fmin(fmax(floor((mx - radius) / kTileSize), 0.0), gx);
  const double y0 = fmin(fmax(floor((my - radius) / kTileSize), 0.0), gy);
  const double x1 = fmin(fmax(ceil((mx + radius) / kTileSize), 0.0), gx);
  const double y1 = fmin(fmax(ceil((my + radius) / kTileSize), 0.0), gy);
  if (!(radius > 0.0) || !(x1 > x0) || !(y1 > y0)) return f;
  f.radius = static_cast<int32_t>(fmin(radius, 2147483647.0));
  f.conic[0] = static_cast<float>(cc / det);
  f.conic[1] = static_cast<float>(-cb / det);
  f.conic[2] = static_cast<float>(ca / det);

  // --- tile rectangle: the square's tiles that the box where alpha can reach 1/255 touches;
  // a visible Gaussian (radius > 0, as the spec keeps it) may touch none ---
  double ex, ey;
  if (!tile_box(ca, cc, det, opacity, mx, my, ex, ey)) return f;
  const double bx0 = fmax(x0, fmin(fmax(floor((mx - ex) / kTileSize), 0.0), gx));
  const double by0 = fmax(y0, fmin(fmax(floor((my - ey) / kTileSize), 0.0), gy));
  const double bx1 = fmin(x1, fmin(fmax(ceil((mx + ex) / kTileSize), 0.0), gx));
  const double by1 = fmin(y1, fmin(fmax(ceil((my + ey) / kTileSize), 0.0), gy));
  if (!(bx1 > bx0) || !(by1 > by0)) return f;
  f.rect = make_int4(static_cast<int>(bx0), static_cast<int>(by0), static_cast<int>(bx1),
                     static_cast<int>(by1));
  f.count = static_cast<int64_t>(f.rect.z - f.rect.x) * (f.rect.w - f.rect.y);
  return f;
}

// One pass over a Gaussian's colour values `row` [len] (RGB, or SH [K, 3] with K <= 16 basis
// functions used): whether all are finite, and with SH (count > 0) the colour sums s[ch] =
// sum_{k < count} basis[k] row[3 k + ch] in float64, accumulated exactly as sh_sums does (the
// backward's clamp decision takes the same bits). Rows of whole groups of 4 values that are
// aligned (SH degree 1 or 3 stored) are read 4 at a time (float4, or 8 bytes of 16-bit
// values): a quarter of the load instructions of the scalar path, and each value is read once
// (the validation used to read it again).
template <typename T>
__device__ __forceinline__ bool colour_row(const T* row, int len, int count,
                                           const double basis[16], double s[3]) {
  constexpr int kVec = 3 * kShStagedCoeffs / 4;  // groups of 4 of 16 coefficients x 3
  bool ok = true;
  s[0] = s[1] = s[2] = 0.0;
  auto take = [&](int e, float v) {  // e: compile-time after unrolling
    ok &= finite(v);
    const int k = e / 3;
    if (k < count) s[e % 3] = fma(basis[k], static_cast<double>(v), s[e % 3]);
  };
  if ((len & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & (4 * sizeof(T) - 1)) == 0) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (4 * j < len) {
        const float4 v = load4(row + 4 * j);
        take(4 * j, v.x);
        take(4 * j + 1, v.y);
        take(4 * j + 2, v.z);
        take(4 * j + 3, v.w);
      }
    }
    for (int j = kVec; j < len / 4; ++j) {  // beyond 16 coefficients: validated only
      const float4 v = load4(row + 4 * j);
      ok &= finite(v.x) & finite(v.y) & finite(v.z) & finite(v.w);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4 * kVec; ++e) {
      if (e < len) take(e, load1(row + e));
    }
    for (int e = 4 * kVec; e < len; ++e) ok &= finite(load1(row + e));
  }
  return ok;
}

// T: the parameters' element type (float, __nv_bfloat16, __half); read once, as float.
template <typename T>
__global__ void __launch_bounds__(kThreads) preprocess_kernel(const PreprocessArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) {
    if (!camera_ok<T>(a)) atomicMin(&a.bad[kBadCamera], 0);
    if (a.background_f32 != nullptr) {
      for (int k = 0; k < 3; ++k) {
        a.background_f32[k] = to_float(static_cast<const T*>(a.background)[k]);
      }
    }
  }
  if (i >= a.n) return;
  const int64_t i64 = i;

  // --- inputs; the camera point first, which the SH colour needs (from unvalidated means it
  // is garbage, used only once they are valid) ---
  const T* mp = static_cast<const T*>(a.means) + 3 * i64;
  const T* spp = static_cast<const T*>(a.scales) + 3 * i64;
  const T* qpp = static_cast<const T*>(a.rotations) + 4 * i64;
  const float m[3] = {to_float(mp[0]), to_float(mp[1]), to_float(mp[2])};
  const float sp[3] = {to_float(spp[0]), to_float(spp[1]), to_float(spp[2])};
  const float qp[4] = {to_float(qpp[0]), to_float(qpp[1]), to_float(qpp[2]), to_float(qpp[3])};
  const float opacity = to_float(static_cast<const T*>(a.opacities)[i]);
  const int color_values = a.sh_degree < 0 ? 3 : 3 * a.sh_coeffs;
  const T* cp = static_cast<const T*>(a.colors) + color_values * i64;
  const CameraPoint cam = world_to_camera(a.viewmat, a.intrinsics, m);
  double basis[16] = {};
  int count = 0;
  if (a.sh_degree >= 0) {
    double dir[3];
    view_direction(cam, dir);
    count = sh_basis(a.sh_degree, dir[0], dir[1], dir[2], basis);
  }
  double s[3];
  const bool colours_finite = colour_row(cp, color_values, count, basis, s);

  // --- validation (the reference's checks, without a host round trip); `&`, not `&&`, so
  // that no load waits for another ---
  bool all_finite = finite(opacity) & colours_finite;
  for (int k = 0; k < 3; ++k) all_finite &= finite(m[k]) & finite(sp[k]);
  for (int k = 0; k < 4; ++k) all_finite &= finite(qp[k]);
  const bool scale_ok = (sp[0] > 0.0f) & (sp[1] > 0.0f) & (sp[2] > 0.0f);
  const bool opacity_ok = (opacity >= 0.0f) & (opacity <= 1.0f);
  const bool rotation_ok = (qp[0] != 0.0f) | (qp[1] != 0.0f) | (qp[2] != 0.0f) | (qp[3] != 0.0f);
  if (!all_finite) atomicMin(&a.bad[kBadNonFinite], i);
  if (!scale_ok) atomicMin(&a.bad[kBadScale], i);
  if (!opacity_ok) atomicMin(&a.bad[kBadOpacity], i);
  if (!rotation_ok) atomicMin(&a.bad[kBadRotation], i);
  const bool valid = all_finite & scale_ok & opacity_ok & rotation_ok;
  if (a.opacities_f32 != nullptr) a.opacities_f32[i] = opacity;

  // --- screen mean, depth, colour (for every valid Gaussian, culled or not) ---
  const double mx = cam.fx * cam.u + cam.cx, my = cam.fy * cam.v + cam.cy;
  if (valid) {
    a.means2d[i] = make_float2(static_cast<float>(mx), static_cast<float>(my));
    a.depths[i] = static_cast<float>(cam.z);
    float* rgb_out = a.rgb + 3 * i64;
    for (int ch = 0; ch < 3; ++ch) {
      rgb_out[ch] = a.sh_degree < 0 ? to_float(cp[ch])
                                    : static_cast<float>(fmax(s[ch] + 0.5, 0.0));
    }
  }

  // --- radius, tiles and conic (zeros when culled, or for an invalid row) ---
  const Footprint f = valid ? footprint(a, cam, sp, qp, opacity, mx, my) : Footprint{};
  a.radii[i] = f.radius;
  a.counts[i] = f.count;
  a.rects[i] = f.rect;
  for (int k = 0; k < 3; ++k) a.conics[3 * i64 + k] = f.conic[k];
}

__global__ void __launch_bounds__(kThreads) iota_kernel(int32_t* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

__global__ void __launch_bounds__(kThreads)
    gather_counts_kernel(const int64_t* __restrict__ counts, const int32_t* __restrict__ order,
                         int n, int64_t* __restrict__ sorted_counts) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) sorted_counts[k] = counts[order[k]];
}

// Gaussians with more tiles than this are emitted by their whole warp (coalesced, balanced);
// smaller ones each by its own thread.
constexpr int64_t kEmitAlone = 4;

// One sorted position k per thread: Gaussian order[k] writes its pairs from offsets[k] -
// count on, row by row of its tile rectangle. A Gaussian of many tiles would keep its warp
// waiting (counts range from 1 to thousands) and write 32 scattered runs: those go to the
// whole warp, one after the other, 32 consecutive pairs at a time.
template <typename Key>
__global__ void __launch_bounds__(kThreads)
    emit_kernel(const int64_t* __restrict__ counts, const int32_t* __restrict__ order,
                const int64_t* __restrict__ offsets, const int4* __restrict__ rects, int n,
                int tiles_x, Key* __restrict__ keys, int32_t* __restrict__ values) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32;
  int i = 0;
  int64_t count = 0, first = 0;
  int4 r = make_int4(0, 0, 0, 0);
  if (k < n) {
    i = order[k];
    count = counts[i];
    if (count > 0) {
      first = offsets[k] - count;
      r = rects[i];
    }
  }
  if (count > 0 && count <= kEmitAlone) {
    int64_t out = first;
    for (int y = r.y; y < r.w; ++y) {
      for (int x = r.x; x < r.z; ++x) {
        keys[out] = static_cast<Key>(static_cast<uint32_t>(y) * tiles_x + x);
        values[out] = i;
        ++out;
      }
    }
  }
  unsigned large = __ballot_sync(0xffffffffu, count > kEmitAlone);
  while (large != 0) {
    const int src = __ffs(large) - 1;
    large &= large - 1;
    const int gi = __shfl_sync(0xffffffffu, i, src);
    const int64_t gc = __shfl_sync(0xffffffffu, count, src);
    const int64_t gf = __shfl_sync(0xffffffffu, first, src);
    const int x0 = __shfl_sync(0xffffffffu, r.x, src);
    const int y0 = __shfl_sync(0xffffffffu, r.y, src);
    const int w = __shfl_sync(0xffffffffu, r.z, src) - x0;
    for (int t = lane; t < gc; t += 32) {  // gc <= tiles < 2^24
      const int dy = t / w;
      keys[gf + t] = static_cast<Key>(static_cast<uint32_t>(y0 + dy) * tiles_x + x0 + t -
                                      dy * w);
      values[gf + t] = gi;
    }
  }
}

template <typename Key>
__global__ void __launch_bounds__(kThreads)
    ranges_kernel(const Key* __restrict__ keys, int items, int2* __restrict__ ranges) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= items) return;
  const uint32_t tile = keys[k];
  if (k == 0) {
    ranges[tile].x = 0;
  } else {
    const uint32_t prev = keys[k - 1];
    if (prev != tile) {
      ranges[prev].y = k;
      ranges[tile].x = k;
    }
  }
  if (k == items - 1) ranges[tile].y = items;
}

// One Gaussian of the batch being composited, in shared memory (one base address for an
// iteration's loads).
struct RenderGaussian {
  float4 coef;   // exponent_coefficients: -a / 2, -b, -c / 2 and the opacity
  float4 color;  // r, g, b, depth
  float2 xy;     // screen mean
  float2 unused;
};

__global__ void __launch_bounds__(kBlockPixels)
    render_kernel(const SplatInputs in, float* __restrict__ image, float* __restrict__ alpha_out,
                  float* __restrict__ depth_out, float* __restrict__ final_T,
                  int32_t* __restrict__ n_contrib) {
  __shared__ RenderGaussian s_gauss[kBlockPixels];

  const int tid = threadIdx.x;
  const int px = blockIdx.x * kTileSize + tid % kTileSize;
  const int py = blockIdx.y * kTileSize + tid / kTileSize;
  const bool inside = px < in.width && py < in.height;
  const float cx = static_cast<float>(px) + 0.5f;
  const float cy = static_cast<float>(py) + 0.5f;
  const int2 range = in.ranges[blockIdx.y * in.tiles_x + blockIdx.x];

  float T = 1.0f;
  float rgb[3] = {0.0f, 0.0f, 0.0f};
  float depth = 0.0f;
  float weight = 0.0f;  // sum of a T: alpha, accurate also where it is small (unlike 1 - T)
  int last = 0;
  bool done = !inside;
  for (int start = range.x; start < range.y; start += kBlockPixels) {
    // Also the barrier that protects the previous batch in shared memory.
    if (__syncthreads_count(done) == kBlockPixels) break;
    const int k = start + tid;
    if (k < range.y) {
      const int g = in.ids[k];
      const float* co = in.conics + 3 * static_cast<int64_t>(g);
      const float* c = in.rgb + 3 * static_cast<int64_t>(g);
      RenderGaussian& sg = s_gauss[tid];
      sg.xy = in.means2d[g];
      sg.coef = exponent_coefficients(co, in.opacities[g]);
      sg.color = make_float4(c[0], c[1], c[2], in.depths[g]);
    }
    __syncthreads();
    const int batch = min(kBlockPixels, range.y - start);
    const RenderGaussian* sg = s_gauss;
    for (int j = 0; !done && j < batch; ++j, ++sg) {
      const float4 coef = sg->coef;
      const float2 xy = sg->xy;
      float dy;
      const float power = gaussian_power(exponent_column(coef, xy.x, cx), coef, xy.y, cy, dy);
      if (!(power <= 0.0f)) continue;
      const float a = fminf(kAlphaMax, __fmul_rn(coef.w, gaussian_exp(power)));
      if (a < kAlphaMin) continue;
      const float next_T = T * (1.0f - a);
      if (next_T < kTransmittanceMin) {
        done = true;
        break;
      }
      const float4 cd = sg->color;
      const float w = a * T;
      rgb[0] += cd.x * w;
      rgb[1] += cd.y * w;
      rgb[2] += cd.z * w;
      depth += cd.w * w;
      weight += w;
      T = next_T;
      last = start - range.x + j + 1;
    }
  }
  if (!inside) return;
  const int64_t plane = static_cast<int64_t>(in.width) * in.height;
  const int64_t pix = static_cast<int64_t>(py) * in.width + px;
  for (int ch = 0; ch < 3; ++ch) image[ch * plane + pix] = rgb[ch] + T * in.background[ch];
  // alpha = 1 - T in exact arithmetic; the sum of the weights keeps depth = sum z w / sum w
  // exact for a single Gaussian, which the backward pass relies on (no cancellation)
  alpha_out[pix] = weight;
  depth_out[pix] = weight > 0.0f ? depth / weight : 0.0f;
  final_T[pix] = T;
  n_contrib[pix] = last;
}

int blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

}  // namespace

void launch_preprocess(const PreprocessArgs& args, cudaStream_t stream) {
  switch (args.scalar) {
    case Scalar::kBFloat16:
      preprocess_kernel<__nv_bfloat16><<<blocks(args.n), kThreads, 0, stream>>>(args);
      break;
    case Scalar::kFloat16:
      preprocess_kernel<__half><<<blocks(args.n), kThreads, 0, stream>>>(args);
      break;
    default:
      preprocess_kernel<float><<<blocks(args.n), kThreads, 0, stream>>>(args);
      break;
  }
}

size_t depth_sort_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), n, 0, 32);
  return bytes;
}

cudaError_t depth_sort(void* temp, size_t temp_bytes, const float* depths, uint32_t* depth_keys,
                       int32_t* iota, int32_t* order, int n, cudaStream_t stream) {
  iota_kernel<<<blocks(n), kThreads, 0, stream>>>(iota, n);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes,
                                         reinterpret_cast<const uint32_t*>(depths), depth_keys,
                                         iota, order, n, 0, 32, stream);
}

void launch_gather_counts(const int64_t* counts, const int32_t* order, int n,
                          int64_t* sorted_counts, cudaStream_t stream) {
  gather_counts_kernel<<<blocks(n), kThreads, 0, stream>>>(counts, order, n, sorted_counts);
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

template <typename Key>
void launch_emit(const int64_t* counts, const int32_t* order, const int64_t* offsets,
                 const int4* rects, int n, int tiles_x, Key* keys, int32_t* values,
                 cudaStream_t stream) {
  emit_kernel<Key><<<blocks(n), kThreads, 0, stream>>>(counts, order, offsets, rects, n,
                                                         tiles_x, keys, values);
}

template <typename Key>
size_t sort_temp_bytes(int items, int end_bit) {
  size_t bytes = 0;
  cub::DoubleBuffer<Key> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, items, 0, end_bit);
  return bytes;
}

template <typename Key>
cudaError_t sort_pairs(void* temp, size_t temp_bytes, Key* keys, Key* keys_alt, int32_t* values,
                       int32_t* values_alt, int items, int end_bit, Key** keys_out,
                       int32_t** values_out, cudaStream_t stream) {
  cub::DoubleBuffer<Key> k(keys, keys_alt);
  cub::DoubleBuffer<int32_t> v(values, values_alt);
  const cudaError_t err =
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k, v, items, 0, end_bit, stream);
  *keys_out = k.Current();
  *values_out = v.Current();
  return err;
}

template <typename Key>
void launch_ranges(const Key* sorted_keys, int items, int2* ranges, cudaStream_t stream) {
  ranges_kernel<Key><<<blocks(items), kThreads, 0, stream>>>(sorted_keys, items, ranges);
}

#define GPUCHECK_SPLAT_BINNING(Key)                                                           \
  template void launch_emit<Key>(const int64_t*, const int32_t*, const int64_t*, const int4*, \
                                 int, int, Key*, int32_t*, cudaStream_t);                     \
  template size_t sort_temp_bytes<Key>(int, int);                                             \
  template cudaError_t sort_pairs<Key>(void*, size_t, Key*, Key*, int32_t*, int32_t*, int,    \
                                       int, Key**, int32_t**, cudaStream_t);                  \
  template void launch_ranges<Key>(const Key*, int, int2*, cudaStream_t);
GPUCHECK_SPLAT_BINNING(uint16_t)
GPUCHECK_SPLAT_BINNING(uint32_t)
#undef GPUCHECK_SPLAT_BINNING

void launch_render(const SplatInputs& in, float* image, float* alpha, float* depth,
                   float* final_T, int32_t* n_contrib, cudaStream_t stream) {
  const dim3 grid(in.tiles_x, in.tiles_y);
  render_kernel<<<grid, kBlockPixels, 0, stream>>>(in, image, alpha, depth, final_T, n_contrib);
}

}  // namespace gpucheck::splat
