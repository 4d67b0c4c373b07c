// Device functions shared by the forward (splat_cuda.cu) and backward (splat_backward.cu)
// kernels of the Gaussian-splatting rasterizer: world -> camera with the pinhole quantities and
// the EWA Jacobian, the SH view direction and basis, quaternion rotation, and the one exponent
// formula that both compositing passes must evaluate to the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "splat/splat.h"

namespace gpucheck::splat {

// --- the parameters' element types (Scalar): read as float, written rounded to nearest ---
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Four consecutive values from a 4-element-aligned address (16 bytes for float, 8 for the
// 16-bit types), through the read-only cache.
__device__ __forceinline__ float4 load4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// One value of a parameter through the read-only cache, as float.
template <typename T>
__device__ __forceinline__ float load1(const T* p) {
  return to_float(__ldg(p));
}

// One Gaussian's mean in camera space, in float64 from the float32 inputs: what preprocess and
// project_backward both start from (the reference's `project`).
struct CameraPoint {
  double W[3][3];  // rotation of viewmat [4, 4] (world -> camera, row-major)
  double t[3];     // its translation
  double m[3];     // the world-space mean
  double p[3];     // W m + t
  double z;        // camera depth p[2]
  bool in_front;   // z > kNearPlane
  double zs;       // z, or 1 behind the near plane (culled rows stay finite, as the reference)
  double fx, fy, cx, cy;  // intrinsics K [3, 3]
  double u, v;     // p[0] / zs, p[1] / zs; the screen mean is (fx u + cx, fy v + cy)
};

__device__ __forceinline__ CameraPoint world_to_camera(const float* viewmat, const float* K,
                                                       const float* mean) {
  CameraPoint c;
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 3; ++k) c.W[r][k] = viewmat[4 * r + k];
    c.t[r] = viewmat[4 * r + 3];
    c.m[r] = mean[r];
  }
  for (int r = 0; r < 3; ++r) {
    c.p[r] = c.W[r][0] * c.m[0] + c.W[r][1] * c.m[1] + c.W[r][2] * c.m[2] + c.t[r];
  }
  c.z = c.p[2];
  c.in_front = c.z > kNearPlane;
  c.zs = c.in_front ? c.z : 1.0;
  c.fx = K[0];
  c.cx = K[2];
  c.fy = K[4];
  c.cy = K[5];
  c.u = c.p[0] / c.zs;
  c.v = c.p[1] / c.zs;
  return c;
}

// The clamp of the EWA Jacobian: x/z and y/z clamped to 1.3x the half field of view measured
// from the principal point. Only for Gaussians in front of the near plane.
struct EwaClamp {
  double uc, vc;        // u, v after the clamp
  bool u_free, v_free;  // strictly inside the clamp limits (so d uc / d u = 1, else 0)
};

__device__ __forceinline__ EwaClamp ewa_clamp(const CameraPoint& c, int width, int height) {
  const double margin_x = 0.3 * 0.5 * width / c.fx, margin_y = 0.3 * 0.5 * height / c.fy;
  const double lo_x = -c.cx / c.fx - margin_x, hi_x = (width - c.cx) / c.fx + margin_x;
  const double lo_y = -c.cy / c.fy - margin_y, hi_y = (height - c.cy) / c.fy + margin_y;
  EwaClamp j;
  j.uc = fmin(fmax(c.u, lo_x), hi_x);
  j.vc = fmin(fmax(c.v, lo_y), hi_y);
  j.u_free = c.u > lo_x && c.u < hi_x;
  j.v_free = c.v > lo_y && c.v < hi_y;
  return j;
}

// T = J W, J the pinhole Jacobian at the mean with the clamp above: J = [[fx / z, 0,
// -fx uc / z], [0, fy / z, -fy vc / z]].
struct EwaJacobian {
  double T[2][3];
  double uc, vc;
  bool u_free, v_free;
};

__device__ __forceinline__ EwaJacobian ewa_jacobian(const CameraPoint& c, int width,
                                                    int height) {
  const EwaClamp cl = ewa_clamp(c, width, height);
  EwaJacobian j;
  j.uc = cl.uc;
  j.vc = cl.vc;
  j.u_free = cl.u_free;
  j.v_free = cl.v_free;
  for (int k = 0; k < 3; ++k) {
    j.T[0][k] = c.fx / c.z * c.W[0][k] + (-c.fx * j.uc / c.z) * c.W[2][k];
    j.T[1][k] = c.fy / c.z * c.W[1][k] + (-c.fy * j.vc / c.z) * c.W[2][k];
  }
  return j;
}

// The SH view direction: from the camera centre -W^T t to the mean, normalized as
// F.normalize does (dir receives it); returns the norm used, max(|d|, 1e-12).
__device__ __forceinline__ double view_direction(const CameraPoint& c, double dir[3]) {
  double d[3];
  for (int k = 0; k < 3; ++k) {
    d[k] = c.m[k] + (c.W[0][k] * c.t[0] + c.W[1][k] * c.t[1] + c.W[2][k] * c.t[2]);
  }
  const double dn = fmax(sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), 1e-12);
  for (int k = 0; k < 3; ++k) dir[k] = d[k] / dn;
  return dn;
}

// Real SH constants (gpucheck/reference/splat_sh.py); scalars, since constexpr arrays are not
// visible in device code.
constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;
constexpr double kC2a = 1.0925484305920792;   // sqrt(15) / (2 sqrt(pi))
constexpr double kC2b = 0.31539156525252005;  // sqrt(5) / (4 sqrt(pi))
constexpr double kC2c = 0.5462742152960396;   // sqrt(15) / (4 sqrt(pi))
constexpr double kC3a = 0.5900435899266435;   // sqrt(70) / (8 sqrt(pi))
constexpr double kC3b = 2.890611442640554;    // sqrt(105) / (2 sqrt(pi))
constexpr double kC3c = 0.4570457994644658;   // sqrt(42) / (8 sqrt(pi))
constexpr double kC3d = 0.3731763325901154;   // sqrt(7) / (4 sqrt(pi))
constexpr double kC3e = 1.445305721320277;    // sqrt(105) / (4 sqrt(pi))

// The SH basis at unit direction (x, y, z) up to `degree`; returns the number of functions.
// Real: double (colours) or float (gradients).
template <typename Real>
__device__ __forceinline__ int sh_basis(int degree, Real x, Real y, Real z, Real basis[16]) {
  constexpr Real c0 = kC0, c1 = kC1, c2a = kC2a, c2b = kC2b, c2c = kC2c, c3a = kC3a, c3b = kC3b,
                 c3c = kC3c, c3d = kC3d, c3e = kC3e;
  constexpr Real two = 2, three = 3, four = 4;
  basis[0] = c0;
  if (degree < 1) return 1;
  basis[1] = -c1 * y;
  basis[2] = c1 * z;
  basis[3] = -c1 * x;
  if (degree < 2) return 4;
  const Real xx = x * x, yy = y * y, zz = z * z;
  basis[4] = c2a * x * y;
  basis[5] = -c2a * y * z;
  basis[6] = c2b * (two * zz - xx - yy);
  basis[7] = -c2a * x * z;
  basis[8] = c2c * (xx - yy);
  if (degree < 3) return 9;
  basis[9] = -c3a * y * (three * xx - yy);
  basis[10] = c3b * x * y * z;
  basis[11] = -c3c * y * (four * zz - xx - yy);
  basis[12] = c3d * z * (two * zz - three * xx - three * yy);
  basis[13] = -c3c * x * (four * zz - xx - yy);
  basis[14] = c3e * z * (xx - yy);
  basis[15] = -c3a * x * (xx - three * yy);
  return 16;
}

// Rotation matrix of the quaternion qp (wxyz, unnormalized); q receives the normalized
// quaternion and the return value is the norm used (F.normalize's max(norm, 1e-12)).
__device__ __forceinline__ double quat_rotmat(const float* qp, double q[4], double R[3][3]) {
  const double n = fmax(sqrt(static_cast<double>(qp[0]) * qp[0] + static_cast<double>(qp[1]) *
                             qp[1] + static_cast<double>(qp[2]) * qp[2] +
                             static_cast<double>(qp[3]) * qp[3]), 1e-12);
  for (int k = 0; k < 4; ++k) q[k] = qp[k] / n;
  const double w = q[0], x = q[1], y = q[2], z = q[3];
  R[0][0] = 1 - 2 * (y * y + z * z);
  R[0][1] = 2 * (x * y - w * z);
  R[0][2] = 2 * (x * z + w * y);
  R[1][0] = 2 * (x * y + w * z);
  R[1][1] = 1 - 2 * (x * x + z * z);
  R[1][2] = 2 * (y * z - w * x);
  R[2][0] = 2 * (x * z - w * y);
  R[2][1] = 2 * (y * z + w * x);
  R[2][2] = 1 - 2 * (x * x + y * y);
  return n;
}

// The colour sums s[ch] = sum_k basis_k(dir) row[3 k + ch] (k < the basis size of `degree`)
// in float64, with explicit fmas in the order of the forward's colour (colour_row in
// splat_cuda.cu: rgb = max(s + 0.5, 0)), for the backward's clamp decision. `row` holds one
// Gaussian's SH coefficients [K, 3] (K >= the basis size). Compile-time loop bounds keep the
// basis in registers. Returns the basis size.
template <typename P>
__device__ __forceinline__ int sh_sums(int degree, const double dir[3], const P* row,
                                       double s[3]) {
  double basis[16] = {};
  const int count = sh_basis(degree, dir[0], dir[1], dir[2], basis);
  s[0] = s[1] = s[2] = 0.0;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    if (k < count) {
#pragma unroll
      for (int ch = 0; ch < 3; ++ch) {
        s[ch] = fma(basis[k], static_cast<double>(to_float(row[3 * k + ch])), s[ch]);
      }
    }
  }
  return count;
}

// SH rows staged through shared memory, so that a warp reads (and writes) the SH arrays of
// its 32 consecutive Gaussians as one contiguous, coalesced chunk instead of 48 accesses of
// stride 192 bytes per thread. A staged row holds up to kShStagedCoeffs coefficients x 3
// channels; its stride is odd, so the 32 threads of a warp reading their own rows hit 32
// different banks.
constexpr int kShStagedCoeffs = 16;
constexpr int kShRowStride = 3 * kShStagedCoeffs + 1;

// Copies `rows` rows of `len` values between global memory (element type G), row-major from
// row `base` (coalesced), and the warp's float shared buffer (row stride kShRowStride).
// kLoad: global -> buffer: buffer[r * kShRowStride + j] = global[(base + r) * len + j]
// (converted to float); else buffer -> global (rounded to G). One warp; lane = the caller's
// lane; len = 3 * coefficients <= 3 * kShStagedCoeffs. The values go kCopyBatch a lane at a
// time, all read before any is written, so that a batch's global loads are in flight together:
// a warp's 1536 values of SH degree 3 take 6 load latencies where one value at a time (each
// store waiting for its load) took 48, which with ~24 warps an SM and ~600 cycles a load
// bounds the read of the SH rows at ~1.2 TB/s (estimate; the DRAM gives 3.35). The loads are
// unpredicated (past the rows, a lane reads the last value again): predicated, the eighth
// waited for a free predicate register, after the first stores.
constexpr int kCopyBatch = 8;

template <bool kLoad, typename G>
__device__ __forceinline__ void warp_copy_rows(G* __restrict__ global,
                                               float* __restrict__ buffer, int64_t base,
                                               int rows, int len, int lane) {
  const int64_t offset = base * len;
  const int total = rows * len;
  int r = 0, j = lane;  // row and column of element e = lane + 32 i, walked along
  while (j >= len) {
    j -= len;
    ++r;
  }
  for (int first = lane; first < total; first += 32 * kCopyBatch) {
    int at[kCopyBatch];  // buffer index of element first + 32 u
#pragma unroll
    for (int u = 0; u < kCopyBatch; ++u) {
      at[u] = r * kShRowStride + j;
      j += 32;
      while (j >= len) {
        j -= len;
        ++r;
      }
    }
    float v[kCopyBatch];
#pragma unroll
    for (int u = 0; u < kCopyBatch; ++u) {
      const int e = first + 32 * u;
      if constexpr (kLoad) {
        v[u] = to_float(global[offset + min(e, total - 1)]);  // unpredicated: all in flight
      } else if (e < total) {
        v[u] = buffer[at[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyBatch; ++u) {
      const int e = first + 32 * u;
      if (e < total) {
        if constexpr (kLoad) {
          buffer[at[u]] = v[u];
        } else {
          global[offset + e] = from_float<std::remove_const_t<G>>(v[u]);
        }
      }
    }
  }
}

// The exponent of a Gaussian at a pixel centre, power = -(a dx^2 + c dy^2) / 2 - b dx dy
// (d = (dx, dy) = screen mean - centre, (a, b, c) its conic), and G = exp(power) = 2^(power
// log2 e) by ex2.approx. render and render_backward must form the same bits (they take every
// skip decision alike), so every operation is explicitly rounded (an fma only where one is
// written), and they split the work the same way: the coefficients (-a / 2, -b, -c / 2, exact)
// once per Gaussian (exponent_coefficients), the terms of dx once per pixel column
// (exponent_column: a thread of render_backward walks several pixels of one column), per pixel
// dy and two fmas (gaussian_power), then one multiply and ex2 (gaussian_exp). 8 operations and
// ex2 a pixel (4 where a column's 4 are shared), where the exponent without fmas and expf
// took 11 and 9. Rounding (for tile_box's margins in splat_cuda.cu): at most 6 roundings on
// each of the exponent's three terms (the conic's, dx and dy, the products, the two fmas), as
// many as before; the multiply by log2 e adds one relative to the exponent itself.
constexpr float kLog2e = 1.442695040888963407360f;

// (-a / 2, -b, -c / 2, opacity) from the conic (a, b, c): exact (powers of 2).
__device__ __forceinline__ float4 exponent_coefficients(const float* conic, float opacity) {
  return make_float4(-0.5f * conic[0], -conic[1], -0.5f * conic[2], opacity);
}

// What the exponent takes from a pixel column: dx, A dx^2 and B dx (coef: exponent_coefficients).
struct ExponentColumn {
  float dx, axx, bx;
};

__device__ __forceinline__ ExponentColumn exponent_column(float4 coef, float mean_x, float px) {
  const float dx = __fsub_rn(mean_x, px);
  return {dx, __fmul_rn(__fmul_rn(coef.x, dx), dx), __fmul_rn(coef.y, dx)};
}

// The exponent at the pixel of column col and centre py; dy receives mean_y - py.
__device__ __forceinline__ float gaussian_power(const ExponentColumn& col, float4 coef,
                                                float mean_y, float py, float& dy) {
  dy = __fsub_rn(mean_y, py);
  return __fmaf_rn(dy, __fmaf_rn(coef.z, dy, col.bx), col.axx);
}

// exp(power) as 2^(power log2 e), the hardware's approximation (ex2.approx: within 2 ulp, 0
// below 2^-126).
__device__ __forceinline__ float gaussian_exp(float power) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(power, kLog2e)));
  return y;
}

}  // namespace gpucheck::splat
