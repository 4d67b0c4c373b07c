// Device functions shared by the forward (splat_cuda.cu) and backward (splat_backward.cu)
// kernels of the Gaussian-splatting rasterizer: SH basis, quaternion rotation, and the one
// alpha formula that both compositing passes must evaluate to the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "splat/splat.h"

namespace gpucheck::splat {

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
__device__ __forceinline__ int sh_basis(int degree, double x, double y, double z,
                                        double basis[16]) {
  basis[0] = kC0;
  if (degree < 1) return 1;
  basis[1] = -kC1 * y;
  basis[2] = kC1 * z;
  basis[3] = -kC1 * x;
  if (degree < 2) return 4;
  const double xx = x * x, yy = y * y, zz = z * z;
  basis[4] = kC2a * x * y;
  basis[5] = -kC2a * y * z;
  basis[6] = kC2b * (2.0 * zz - xx - yy);
  basis[7] = -kC2a * x * z;
  basis[8] = kC2c * (xx - yy);
  if (degree < 3) return 9;
  basis[9] = -kC3a * y * (3.0 * xx - yy);
  basis[10] = kC3b * x * y * z;
  basis[11] = -kC3c * y * (4.0 * zz - xx - yy);
  basis[12] = kC3d * z * (2.0 * zz - 3.0 * xx - 3.0 * yy);
  basis[13] = -kC3c * x * (4.0 * zz - xx - yy);
  basis[14] = kC3e * z * (xx - yy);
  basis[15] = -kC3a * x * (xx - 3.0 * yy);
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

// Exponent -0.5 d^T conic d at pixel centre (px, py), d = mean - centre. Explicitly rounded
// operations (no FMA contraction), so that the forward and the backward kernel take every
// skip / stop decision the same way.
__device__ __forceinline__ float gaussian_power(float2 m, float ca, float cb, float cc, float px,
                                                float py, float& dx, float& dy) {
  dx = __fsub_rn(m.x, px);
  dy = __fsub_rn(m.y, py);
  const float quad = __fadd_rn(__fmul_rn(__fmul_rn(ca, dx), dx), __fmul_rn(__fmul_rn(cc, dy), dy));
  return __fsub_rn(__fmul_rn(-0.5f, quad), __fmul_rn(__fmul_rn(cb, dx), dy));
}

}  // namespace gpucheck::splat
