// Tile-based 3D Gaussian splatting rasterizer, backward pass: kernels and launchers.
//
// 1. render_backward: one 16x16 block per tile, one thread per pixel, the tile's Gaussians
//    staged through shared memory 256 at a time, walked back to front from the last one any
//    pixel of the tile composited. Each pixel starts from its final transmittance T_N and
//    undoes one Gaussian at a time (T_i = T_{i+1} / (1 - alpha_i)), carrying
//      R = sum_{j > i} (g . c_j) alpha_j T_j + T_N dL/dT_N
//    (g: the pixel's gradient of the colour and depth channels; the depth output is
//    sum z_i w_i / sum w_i, so its channel value is (z_i - depth) / alpha, which has no
//    cancellation where alpha is small; the background and alpha outputs enter through
//    dL/dT_N), so that
//      dL/dalpha_i = (g . c_i) T_i - R / (1 - alpha_i).
//    From dL/dalpha_i follow the gradients of the opacity, of the exponent and through it of
//    the conic and the screen mean; the colour and depth gradients are g alpha_i T_i. Every
//    lane of a warp walks the same Gaussian at the same time, so the 10 per-Gaussian values
//    are summed over the warp with shuffles and one lane adds them to global memory with
//    atomicAdd (skipped when no lane of the warp touched the Gaussian).
// 2. project_backward: one thread per Gaussian, float64 like the forward's preprocessing:
//    conic -> 2D covariance -> (Jacobian, 3D covariance) -> (mean, scale, quaternion); screen
//    mean and depth -> mean; colour -> SH coefficients and (through the view direction) mean.
//
// Determinism: the float atomicAdds of step 1 make the order of the per-Gaussian sums depend
// on the scheduling of blocks, so gradients are reproducible to rounding, not bitwise.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "splat/splat.h"
#include "splat/splat_device.cuh"

namespace gpucheck::splat {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kGradValues = 10;  // means2d 2, conic 3, opacity 1, rgb 3, depth 1

__global__ void __launch_bounds__(kBlockPixels)
    render_backward_kernel(const SplatInputs in, const RenderGrads gr) {
  __shared__ int32_t s_id[kBlockPixels];
  __shared__ float2 s_xy[kBlockPixels];
  __shared__ float4 s_conic[kBlockPixels];
  __shared__ float4 s_color[kBlockPixels];
  __shared__ int s_last;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int px = blockIdx.x * kTileSize + tid % kTileSize;
  const int py = blockIdx.y * kTileSize + tid / kTileSize;
  const bool inside = px < in.width && py < in.height;
  const float cx = static_cast<float>(px) + 0.5f;
  const float cy = static_cast<float>(py) + 0.5f;
  const int2 range = in.ranges[blockIdx.y * in.tiles_x + blockIdx.x];

  float T = 1.0f;  // transmittance after the Gaussian being undone
  float R = 0.0f;
  float g[3] = {0.0f, 0.0f, 0.0f};
  float g_depth = 0.0f;  // d loss / d (sum_i z_i w_i): d loss / d depth over alpha
  float depth = 0.0f;
  int last = 0;
  if (inside) {
    const int64_t plane = static_cast<int64_t>(in.width) * in.height;
    const int64_t pix = static_cast<int64_t>(py) * in.width + px;
    T = gr.final_T[pix];
    last = gr.n_contrib[pix];
    float g_T = -gr.grad_alpha[pix];  // alpha = 1 - T_N
    for (int ch = 0; ch < 3; ++ch) {
      g[ch] = gr.grad_image[ch * plane + pix];
      g_T += g[ch] * in.background[ch];
    }
    const float acc = gr.alpha[pix];  // sum_i w_i, the forward's alpha
    if (acc > 0.0f) {                 // depth = sum_i z_i w_i / acc (0 where alpha is 0)
      g_depth = gr.grad_depth[pix] / acc;
      depth = gr.depth[pix];
    }
    R = T * g_T;
  }
  if (tid == 0) s_last = 0;
  __syncthreads();
  if (last > 0) atomicMin(&s_last, -last);  // s_last = -max(last)
  __syncthreads();
  const int stop = range.x - s_last;

  for (int end = stop; end > range.x; end -= kBlockPixels) {
    const int start = max(range.x, end - kBlockPixels);
    const int count = end - start;
    __syncthreads();  // the previous batch is consumed
    if (tid < count) {
      const int id = in.ids[start + tid];
      const float* co = in.conics + 3 * static_cast<int64_t>(id);
      const float* c = in.rgb + 3 * static_cast<int64_t>(id);
      s_id[tid] = id;
      s_xy[tid] = in.means2d[id];
      s_conic[tid] = make_float4(co[0], co[1], co[2], in.opacities[id]);
      s_color[tid] = make_float4(c[0], c[1], c[2], in.depths[id]);
    }
    __syncthreads();
    for (int j = count - 1; j >= 0; --j) {
      float v[kGradValues];
      for (int k = 0; k < kGradValues; ++k) v[k] = 0.0f;
      bool take = start - range.x + j < last;
      if (take) {
        const float4 co = s_conic[j];
        float dx, dy;
        const float power = gaussian_power(s_xy[j], co.x, co.y, co.z, cx, cy, dx, dy);
        const float G = expf(power);
        const float og = __fmul_rn(co.w, G);
        const float a = fminf(kAlphaMax, og);
        take = power <= 0.0f && a >= kAlphaMin;
        if (take) {
          const float one_minus = 1.0f - a;
          T = T / one_minus;  // transmittance in front of this Gaussian
          const float w = a * T;
          const float4 cd = s_color[j];
          const float gc =
              g[0] * cd.x + g[1] * cd.y + g[2] * cd.z + g_depth * (cd.w - depth);
          const float g_alpha = gc * T - R / one_minus;
          R += gc * w;
          v[5] = g[0] * w;
          v[6] = g[1] * w;
          v[7] = g[2] * w;
          v[8] = g_depth * w;
          if (og <= kAlphaMax) {  // not clamped
            v[9] = g_alpha * G;                // opacity
            const float g_power = g_alpha * a;
            v[0] = -g_power * (co.x * dx + co.y * dy);  // screen mean x
            v[1] = -g_power * (co.y * dx + co.z * dy);  // screen mean y
            v[2] = -0.5f * g_power * dx * dx;           // conic a
            v[3] = -g_power * dx * dy;                  // conic b
            v[4] = -0.5f * g_power * dy * dy;           // conic c
          }
        }
      }
      if (__any_sync(kFullMask, take)) {
        for (int k = 0; k < kGradValues; ++k) {
          for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(kFullMask, v[k], off);
        }
        if (lane == 0) {
          const int64_t id = s_id[j];
          atomicAdd(&gr.g_means2d[id].x, v[0]);
          atomicAdd(&gr.g_means2d[id].y, v[1]);
          for (int k = 0; k < 3; ++k) atomicAdd(&gr.g_conics[3 * id + k], v[2 + k]);
          for (int k = 0; k < 3; ++k) atomicAdd(&gr.g_rgb[3 * id + k], v[5 + k]);
          atomicAdd(&gr.g_depths[id], v[8]);
          atomicAdd(&gr.g_opacities[id], v[9]);
        }
      }
    }
  }
}

// d loss / d (a, b, c) of the 2D covariance [[a, b], [b, c]] from d loss / d conic, the
// conic being (c, -b, a) / det.
__device__ void conic_backward(double a, double b, double c, const float* gk, double out[3]) {
  const double det = a * c - b * b;
  const double i1 = 1.0 / det, i2 = i1 * i1;
  const double gA = gk[0], gB = gk[1], gC = gk[2];
  out[0] = gA * (-c * c * i2) + gB * (b * c * i2) + gC * (i1 - a * c * i2);
  out[1] = gA * (2.0 * b * c * i2) + gB * (-i1 - 2.0 * b * b * i2) + gC * (2.0 * a * b * i2);
  out[2] = gA * (i1 - a * c * i2) + gB * (a * b * i2) + gC * (-a * a * i2);
}

// d basis / d direction, accumulated: gdir += sum_k gb[k] d basis_k / d (x, y, z).
__device__ void sh_basis_backward(int degree, double x, double y, double z, const double* gb,
                                  double gdir[3]) {
  if (degree < 1) return;
  gdir[0] += -kC1 * gb[3];
  gdir[1] += -kC1 * gb[1];
  gdir[2] += kC1 * gb[2];
  if (degree < 2) return;
  const double xx = x * x, yy = y * y, zz = z * z;
  gdir[0] += kC2a * y * gb[4] - kC2a * z * gb[7] - 2.0 * kC2b * x * gb[6] + 2.0 * kC2c * x * gb[8];
  gdir[1] += kC2a * x * gb[4] - kC2a * z * gb[5] - 2.0 * kC2b * y * gb[6] - 2.0 * kC2c * y * gb[8];
  gdir[2] += -kC2a * y * gb[5] + 4.0 * kC2b * z * gb[6] - kC2a * x * gb[7];
  if (degree < 3) return;
  gdir[0] += -6.0 * kC3a * x * y * gb[9] + kC3b * y * z * gb[10] + 2.0 * kC3c * x * y * gb[11] -
             6.0 * kC3d * x * z * gb[12] - kC3c * (4.0 * zz - 3.0 * xx - yy) * gb[13] +
             2.0 * kC3e * x * z * gb[14] - 3.0 * kC3a * (xx - yy) * gb[15];
  gdir[1] += -3.0 * kC3a * (xx - yy) * gb[9] + kC3b * x * z * gb[10] -
             kC3c * (4.0 * zz - xx - 3.0 * yy) * gb[11] - 6.0 * kC3d * y * z * gb[12] +
             2.0 * kC3c * x * y * gb[13] - 2.0 * kC3e * y * z * gb[14] +
             6.0 * kC3a * x * y * gb[15];
  gdir[2] += kC3b * x * y * gb[10] - 8.0 * kC3c * y * z * gb[11] +
             kC3d * (6.0 * zz - 3.0 * xx - 3.0 * yy) * gb[12] - 8.0 * kC3c * x * z * gb[13] +
             kC3e * (xx - yy) * gb[14];
}

__global__ void __launch_bounds__(kThreads) project_backward_kernel(const ProjectGrads a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  const int64_t i64 = i;
  const float* mp = a.means + 3 * i64;
  const float* sp = a.scales + 3 * i64;
  const float* qp = a.rotations + 4 * i64;
  const CameraPoint cam = world_to_camera(a.viewmat, a.intrinsics, mp);
  const double(&W)[3][3] = cam.W;
  const double z = cam.z, zs = cam.zs;
  const double fx = cam.fx, fy = cam.fy;

  double g_u = a.g_means2d[2 * i64] * fx;  // means2d = (fx u + cx, fy v + cy)
  double g_v = a.g_means2d[2 * i64 + 1] * fy;
  double g_zs = 0.0;
  double g_scale[3] = {0.0, 0.0, 0.0};
  double g_quat[4] = {0.0, 0.0, 0.0, 0.0};

  if (a.radii[i] > 0) {  // the conic exists (and carries a gradient) only for visible ones
    const EwaJacobian jac = ewa_jacobian(cam, a.width, a.height);
    const double(&T)[2][3] = jac.T;
    const double uc = jac.uc, vc = jac.vc;
    double q[4];
    double R[3][3];
    const double qn = quat_rotmat(qp, q, R);
    double M[3][3];  // R diag(s)
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) M[r][c] = R[r][c] * sp[c];
    }
    double A[2][3];  // T M
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 3; ++c) A[r][c] = T[r][0] * M[0][c] + T[r][1] * M[1][c] + T[r][2] * M[2][c];
    }
    const double ca = A[0][0] * A[0][0] + A[0][1] * A[0][1] + A[0][2] * A[0][2] + kLowPass;
    const double cb = A[0][0] * A[1][0] + A[0][1] * A[1][1] + A[0][2] * A[1][2];
    const double cc = A[1][0] * A[1][0] + A[1][1] * A[1][1] + A[1][2] * A[1][2] + kLowPass;
    double g_cov[3];
    conic_backward(ca, cb, cc, a.g_conics + 3 * i64, g_cov);
    // cov = A A^T: dL/dA = 2 Gs A with Gs = [[ga, gb / 2], [gb / 2, gc]]
    const double Gs[2][2] = {{g_cov[0], 0.5 * g_cov[1]}, {0.5 * g_cov[1], g_cov[2]}};
    double gA[2][3];
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 3; ++c) gA[r][c] = 2.0 * (Gs[r][0] * A[0][c] + Gs[r][1] * A[1][c]);
    }
    // A = T M: dL/dT = gA M^T, dL/dM = T^T gA
    double gT[2][3];
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 3; ++c) {
        gT[r][c] = gA[r][0] * M[c][0] + gA[r][1] * M[c][1] + gA[r][2] * M[c][2];
      }
    }
    double gR[3][3];
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) {
        const double gM = T[0][r] * gA[0][c] + T[1][r] * gA[1][c];
        g_scale[c] += gM * R[r][c];
        gR[r][c] = gM * sp[c];
      }
    }
    const double w = q[0], x = q[1], y = q[2], zq = q[3];
    double gq[4];
    gq[0] = 2.0 * (-zq * gR[0][1] + y * gR[0][2] + zq * gR[1][0] - x * gR[1][2] - y * gR[2][0] +
                   x * gR[2][1]);
    gq[1] = 2.0 * (y * gR[0][1] + zq * gR[0][2] + y * gR[1][0] - 2.0 * x * gR[1][1] -
                   w * gR[1][2] + zq * gR[2][0] + w * gR[2][1] - 2.0 * x * gR[2][2]);
    gq[2] = 2.0 * (-2.0 * y * gR[0][0] + x * gR[0][1] + w * gR[0][2] + x * gR[1][0] +
                   zq * gR[1][2] - w * gR[2][0] + zq * gR[2][1] - 2.0 * y * gR[2][2]);
    gq[3] = 2.0 * (-2.0 * zq * gR[0][0] - w * gR[0][1] + x * gR[0][2] + w * gR[1][0] -
                   2.0 * zq * gR[1][1] + y * gR[1][2] + x * gR[2][0] + y * gR[2][1]);
    const double dot = q[0] * gq[0] + q[1] * gq[1] + q[2] * gq[2] + q[3] * gq[3];
    for (int k = 0; k < 4; ++k) g_quat[k] = (gq[k] - q[k] * dot) / qn;
    // T = J W: dL/dJ = gT W^T; J = [[fx / z, 0, -fx uc / z], [0, fy / z, -fy vc / z]]
    double gJ[2][3];
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 3; ++c) {
        gJ[r][c] = gT[r][0] * W[c][0] + gT[r][1] * W[c][1] + gT[r][2] * W[c][2];
      }
    }
    const double iz = 1.0 / z, iz2 = iz * iz;
    g_zs += -fx * iz2 * gJ[0][0] + fx * uc * iz2 * gJ[0][2] - fy * iz2 * gJ[1][1] +
            fy * vc * iz2 * gJ[1][2];
    if (jac.u_free) g_u += -fx * iz * gJ[0][2];
    if (jac.v_free) g_v += -fy * iz * gJ[1][2];
  }

  // u = p0 / zs, v = p1 / zs, depth = z
  double g_p[3];
  g_p[0] = g_u / zs;
  g_p[1] = g_v / zs;
  g_zs += -(g_u * cam.p[0] + g_v * cam.p[1]) / (zs * zs);
  g_p[2] = a.g_depths[i] + (cam.in_front ? g_zs : 0.0);
  double g_m[3];
  for (int c = 0; c < 3; ++c) g_m[c] = W[0][c] * g_p[0] + W[1][c] * g_p[1] + W[2][c] * g_p[2];

  // colour
  const float* grgb = a.g_rgb + 3 * i64;
  if (a.sh_degree < 0) {
    for (int ch = 0; ch < 3; ++ch) a.g_colors[3 * i64 + ch] = grgb[ch];
  } else {
    const float* cp = a.colors + 3 * static_cast<int64_t>(a.sh_coeffs) * i64;
    float* gcp = a.g_colors + 3 * static_cast<int64_t>(a.sh_coeffs) * i64;
    double dir[3];
    const double dn = view_direction(cam, dir);
    // Loops over the 16 basis functions with compile-time bounds (guarded by the run-time
    // count), so that basis and g_basis stay in registers rather than local memory.
    double basis[16] = {};
    const int count = sh_basis(a.sh_degree, dir[0], dir[1], dir[2], basis);
    double g_s[3];
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
      double s = 0.0;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (k < count) s += basis[k] * static_cast<double>(cp[3 * k + ch]);
      }
      g_s[ch] = s + 0.5 >= 0.0 ? static_cast<double>(grgb[ch]) : 0.0;  // clamp_min(0)
    }
    double g_basis[16] = {};
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      if (k < a.sh_coeffs) {
#pragma unroll
        for (int ch = 0; ch < 3; ++ch) {
          gcp[3 * k + ch] = k < count ? static_cast<float>(basis[k] * g_s[ch]) : 0.0f;
          if (k < count) g_basis[k] += static_cast<double>(cp[3 * k + ch]) * g_s[ch];
        }
      }
    }
    for (int k = 16; k < a.sh_coeffs; ++k) {  // coefficients beyond degree 3: no gradient
      for (int ch = 0; ch < 3; ++ch) gcp[3 * k + ch] = 0.0f;
    }
    double g_dir[3] = {0.0, 0.0, 0.0};
    sh_basis_backward(a.sh_degree, dir[0], dir[1], dir[2], g_basis, g_dir);
    const double proj = dir[0] * g_dir[0] + dir[1] * g_dir[1] + dir[2] * g_dir[2];
    for (int c = 0; c < 3; ++c) g_m[c] += (g_dir[c] - dir[c] * proj) / dn;
  }

  for (int c = 0; c < 3; ++c) {
    a.g_means[3 * i64 + c] = static_cast<float>(g_m[c]);
    a.g_scales[3 * i64 + c] = static_cast<float>(g_scale[c]);
  }
  for (int k = 0; k < 4; ++k) a.g_rotations[4 * i64 + k] = static_cast<float>(g_quat[k]);
}

int blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

}  // namespace

void launch_render_backward(const SplatInputs& in, const RenderGrads& g, cudaStream_t stream) {
  const dim3 grid(in.tiles_x, in.tiles_y);
  render_backward_kernel<<<grid, kBlockPixels, 0, stream>>>(in, g);
}

void launch_project_backward(const ProjectGrads& g, cudaStream_t stream) {
  project_backward_kernel<<<blocks(g.n), kThreads, 0, stream>>>(g);
}

}  // namespace gpucheck::splat
