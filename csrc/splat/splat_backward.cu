// Tile-based 3D Gaussian splatting rasterizer, backward pass: kernels and launchers.
//
// 1. render_backward: one block per 16x16 tile, each thread P vertically adjacent pixels of one
//    column (P = kBackwardPixels, 4; 2 with GPUCHECK_SPLAT_BACKWARD_PIXELS=2), the tile's
//    Gaussians staged through shared memory a thread's worth at a time, walked back to front
//    from the last one any pixel of the tile composited. Each pixel starts from its final
//    transmittance T_N and undoes one Gaussian at a time (T_i = T_{i+1} / (1 - alpha_i)),
//    carrying
//      R = sum_{j > i} (g . c_j) alpha_j T_j + T_N dL/dT_N
//    (g: the pixel's gradient of the colour and depth channels; the depth output is
//    sum z_i w_i / sum w_i, so its channel value is (z_i - depth) / alpha, which has no
//    cancellation where alpha is small; the background and alpha outputs enter through
//    dL/dT_N), so that
//      dL/dalpha_i = (g . c_i) T_i - R / (1 - alpha_i).
//    From dL/dalpha_i follow the gradients of the opacity, of the exponent and through it of
//    the conic and the screen mean; the colour and depth gradients are g alpha_i T_i. Every
//    lane of a warp walks the same Gaussian at the same time: a thread first adds its P
//    pixels' 10 values, the warp sums them with a reduce-scatter of 12 shuffles
//    (warp_reduce_scatter; skipped when no pixel of the warp took the Gaussian), the warps'
//    sums meet in shared memory, and every 32 Gaussians the block adds them to global
//    memory: one atomicAdd per Gaussian, tile and value. So the per-(Gaussian, warp) work
//    (the shared loads, the loop, the vote, the reduction and its store) is shared by 16 P
//    pixels, and per pixel there is only the forward's alpha and a branch-free undo; the
//    screen mean's and the conic's gradients are summed as moments of d loss / d exponent
//    (undo_gaussian) and turned into gradients once per tile in the flush. Static SASS of the
//    inner loop (sm_90, a Gaussian that some pixel of the warp took / that none took): one
//    pixel a thread, 8 warps, as before: 180 / 68 instructions per 32 pixels; P = 2: 150 / 39
//    per 64; P = 4: 239 / 61 per 128 (with the exponent without fmas and expf: 172 / 61 and
//    282 / 104). sm_90's vector atomics (two float4 and a float2 a
//    Gaussian into a packed [n, 12] buffer, split afterwards) were tried with one pixel a
//    thread: no faster (issue-bound: ncu 88 % SM throughput either way, 1.48 vs 1.50 ms on an
//    H200).
// 2. project_backward: one thread per Gaussian: conic -> 2D covariance -> (Jacobian, 3D
//    covariance) -> (mean, scale, quaternion); screen mean and depth -> mean; colour -> SH
//    coefficients and (through the view direction) mean. The decisions that must match the
//    forward (the Jacobian clamp, the colour clamp) are taken in float64 from the same
//    formulas as preprocess; the gradients themselves in float32 (the 2D covariance's
//    determinant as a sum of non-negative terms, see covariance_backward). Each warp stages
//    the SH rows of its 32 Gaussians through shared memory, so that SH coefficients are read
//    and their gradients written as coalesced chunks (not 48 accesses of stride 192 bytes a
//    thread), 8 values a lane in flight at a time (warp_copy_rows). float64 throughout took
//    164 registers (12.5 % occupancy) and 0.83 ms at 1M Gaussians on an H200; this took 80
//    registers and 0.44-0.46 ms with one value a lane at a time in the copies, and takes 96
//    (5 blocks of 4 warps an SM, was 6). With bfloat16 / float16
//    parameters (a template on the type) it reads them as such, computes the same float32
//    gradients and rounds each once, at its store, into the parameters' dtype; the opacity
//    and background gradients (summed in float32 by render backward's atomics, for render's
//    float32 copies) are rounded here too.
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

constexpr int kProjectThreads = 128;  // shared SH staging: kShRowStride floats a thread
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kGradValues = 10;  // means2d 2, conic 3, rgb 3, depth 1, opacity 1
constexpr int kSub = 32;  // render backward: Gaussians per flush of the block's partial sums

// Sums v[0..9] over the warp and scatters the sums over its lanes: lane l returns the sum of
// value reduce_slot(l) (lanes l and l ^ 1 the same one; lanes whose slot is -1 hold padding).
// Each halving step sends half of the values still held to the partner lane and keeps the
// other half: 5 + 3 + 2 + 1 + 1 = 12 shuffles instead of 10 x 5 for ten butterfly sums, and
// the ten sums end in ten lanes, which then store them in parallel.
__device__ __forceinline__ float warp_reduce_scatter(const float (&v)[kGradValues], int lane) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4, b1 = lane & 2;
  float w[6];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    const float send = b4 ? v[i] : v[5 + i];
    const float keep = b4 ? v[5 + i] : v[i];
    w[i] = keep + __shfl_xor_sync(kFullMask, send, 16);
  }
  w[5] = 0.0f;
  float x[4];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const float send = b3 ? w[i] : w[3 + i];
    const float keep = b3 ? w[3 + i] : w[i];
    x[i] = keep + __shfl_xor_sync(kFullMask, send, 8);
  }
  x[3] = 0.0f;
  float y[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float send = b2 ? x[i] : x[2 + i];
    const float keep = b2 ? x[2 + i] : x[i];
    y[i] = keep + __shfl_xor_sync(kFullMask, send, 4);
  }
  const float z = (b1 ? y[1] : y[0]) + __shfl_xor_sync(kFullMask, b1 ? y[0] : y[1], 2);
  return z + __shfl_xor_sync(kFullMask, z, 1);
}

// The value whose warp sum warp_reduce_scatter leaves in `lane` (-1: none).
__device__ __forceinline__ int reduce_slot(int lane) {
  const int x = ((lane & 4) ? 2 : 0) + ((lane & 2) ? 1 : 0);
  const int w = ((lane & 8) ? 3 : 0) + x;
  return x < 3 && w < 5 ? ((lane & 16) ? 5 : 0) + w : -1;
}

// Where value k (the order of kGradValues) of Gaussian id accumulates.
__device__ __forceinline__ float* grad_slot(const RenderGrads& gr, int64_t id, int k) {
  if (k < 2) return reinterpret_cast<float*>(gr.g_means2d + id) + k;
  if (k < 5) return gr.g_conics + 3 * id + (k - 2);
  if (k < 8) return gr.g_rgb + 3 * id + (k - 5);
  return k == 8 ? gr.g_depths + id : gr.g_opacities + id;
}

// 1 / x for x in [2^-125, 2^126] (here 1 - alpha, in [0.01, 1]), correctly rounded: the
// bits of __frcp_rn, whose fast path this is (the approximate reciprocal and one Newton step
// in fma); without its range check and slow-path call in the inner loop.
__device__ __forceinline__ float rcp_rn_normal(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return fmaf(r, fmaf(-x, r, 1.0f), r);
}

// The walk of one pixel back to front (see the file's comment): its transmittance T after the
// Gaussian being undone, R, the gradient of its colour channels g and of sum_i z_i w_i
// (g_depth), its depth, its last contribution's list position + 1 and its centre's y.
struct PixelWalk {
  float T = 1.0f;
  float R = 0.0f;
  float g[3] = {0.0f, 0.0f, 0.0f};
  float g_depth = 0.0f;  // d loss / d (sum_i z_i w_i): d loss / d depth over alpha
  float depth = 0.0f;
  float cy = 0.0f;
  int last = 0;
};

__device__ __forceinline__ PixelWalk start_walk(const SplatInputs& in, const RenderGrads& gr,
                                                int px, int py) {
  PixelWalk p;
  p.cy = static_cast<float>(py) + 0.5f;
  if (px >= in.width || py >= in.height) return p;
  const int64_t plane = static_cast<int64_t>(in.width) * in.height;
  const int64_t pix = static_cast<int64_t>(py) * in.width + px;
  p.T = gr.final_T[pix];
  p.last = gr.n_contrib[pix];
  float g_T = gr.grad_alpha != nullptr ? -gr.grad_alpha[pix] : 0.0f;  // alpha = 1 - T_N
  for (int ch = 0; ch < 3; ++ch) {
    p.g[ch] = gr.grad_image[ch * plane + pix];
    g_T += p.g[ch] * in.background[ch];
  }
  const float acc = gr.alpha[pix];  // sum_i w_i, the forward's alpha
  if (acc > 0.0f && gr.grad_depth != nullptr) {  // depth = sum_i z_i w_i / acc (0 where
    p.g_depth = gr.grad_depth[pix] / acc;        // alpha is 0)
    p.depth = gr.depth[pix];
  }
  p.R = p.T * g_T;
  return p;
}

// One Gaussian at one pixel: the forward's alpha, formed by the forward's operations (the
// same bits: the same skip decisions), and whether the forward composited it there.
struct PixelAlpha {
  float dy;  // mean_y - pixel centre (dx: the column's)
  float G;   // exp(power)
  float og;  // opacity G, before the clamp
  float a;   // alpha
  bool take;
};

// col, coef: the column's terms and the coefficients of the exponent (splat_device.cuh), the
// Gaussian at list position pos with screen mean y mean_y.
__device__ __forceinline__ PixelAlpha pixel_alpha(const PixelWalk& p, const ExponentColumn& col,
                                                  float4 coef, float mean_y, int pos) {
  PixelAlpha e;
  const float power = gaussian_power(col, coef, mean_y, p.cy, e.dy);
  e.G = gaussian_exp(power);
  e.og = __fmul_rn(coef.w, e.G);
  e.a = fminf(kAlphaMax, e.og);
  e.take = pos < p.last && power <= 0.0f && e.a >= kAlphaMin;
  return e;
}

// Undoes the Gaussian (e: its alpha here; dx: mean_x - the pixel's centre x; cd: its colour
// and depth) at pixel p where e.take, and gives its 10 values there (0 where not e.take) to v:
// stored when `first`, else added. The values, in kGradValues's order: with h = -d loss /
// d power (power = -(a dx^2 + c dy^2) / 2 - b dx dy, (a, b, c) the conic) the moments h dx,
// h dy, h dx^2, h dx dy, h dy^2, whose sums m over the tile's pixels give the gradients of the
// screen mean, (a m_x + b m_y, b m_x + c m_y), and of the conic, (m_xx / 2, m_xy, m_yy / 2)
// (flush_value: the conic is the same at every pixel, so it multiplies the sums once, not
// every pixel's terms); then d loss / d (rgb, depth, opacity). Without branches: the warp runs
// this for all its lanes once any of them takes the Gaussian, so selects (of finite values:
// alpha <= 0.99) cost less than divergent paths and the zeros they need.
__device__ __forceinline__ void undo_gaussian(PixelWalk& p, const PixelAlpha& e, float dx,
                                              float4 cd, bool first, float (&v)[kGradValues]) {
  // one reciprocal (correctly rounded) for both divisions by 1 - alpha
  const float inv_one_minus = rcp_rn_normal(1.0f - e.a);
  if (e.take) p.T = p.T * inv_one_minus;  // transmittance in front of this Gaussian
  const float w = e.take ? e.a * p.T : 0.0f;
  const float gc = p.g[0] * cd.x + p.g[1] * cd.y + p.g[2] * cd.z + p.g_depth * (cd.w - p.depth);
  const float g_alpha = gc * p.T - p.R * inv_one_minus;
  p.R += gc * w;
  const bool free = e.take && e.og <= kAlphaMax;  // not clamped: gradients to opacity, power
  const float h = free ? -(g_alpha * e.a) : 0.0f;
  const float hx = h * dx, hy = h * e.dy;
  const float u[kGradValues] = {
      hx,
      hy,
      hx * dx,
      hx * e.dy,
      hy * e.dy,
      p.g[0] * w,
      p.g[1] * w,
      p.g[2] * w,
      p.g_depth * w,
      free ? g_alpha * e.G : 0.0f,  // opacity (G may be inf where power > 0: not taken)
  };
#pragma unroll
  for (int k = 0; k < kGradValues; ++k) v[k] = first ? u[k] : v[k] + u[k];
}

// The gradient value k of a Gaussian from the tile's sums of undo_gaussian's values: value k
// itself (`sum`), value k ^ 1 (`pair`, the other first moment for k < 2) and the conic co.
__device__ __forceinline__ float flush_value(int k, float sum, float pair, float4 co) {
  switch (k) {
    case 0: return co.x * sum + co.y * pair;  // screen mean x: a m_x + b m_y
    case 1: return co.y * pair + co.z * sum;  // screen mean y: b m_x + c m_y
    case 2:
    case 4: return 0.5f * sum;                // conic a, c
    default: return sum;                      // conic b; rgb, depth, opacity
  }
}

// One Gaussian of the batch being walked, in shared memory (one base address for the three
// loads of an iteration).
struct StagedGaussian {
  float4 coef;   // exponent_coefficients: -a / 2, -b, -c / 2 and the opacity
  float4 color;  // r, g, b, depth
  float2 xy;     // screen mean
  int32_t id;
  int32_t unused;
  float4 conic;  // a, b, c (and the opacity): flush_value's
};

// Blocks an SM runs of render_backward_kernel<P>: as many as its registers allow without
// spills (P 2: 61 registers, 8 blocks of 4 warps; P 4: 93, 10 blocks of 2 warps; 12 of them
// would spill 12 bytes).
constexpr int backward_blocks_per_sm(int pixels) { return pixels == 2 ? 8 : 10; }

// One block a 16x16 tile, each thread P vertically adjacent pixels of one column (a warp:
// 16 x 2P pixels).
template <int P>
__global__ void __launch_bounds__(kBlockPixels / P, backward_blocks_per_sm(P))
    render_backward_kernel(const SplatInputs in, const RenderGrads gr) {
  constexpr int kThreads = kBlockPixels / P;
  constexpr int kWarps = kThreads / 32;
  static_assert(kTileSize % P == 0 && kThreads % 32 == 0, "whole columns, whole warps");
  __shared__ StagedGaussian s_gauss[kThreads];
  // per warp, the warp sums of the kSub Gaussians being walked; double-buffered, so that one
  // barrier per kSub Gaussians separates the writes of one group from the flush of the last
  __shared__ float s_part[2][kWarps][kSub * kGradValues];
  __shared__ int s_last;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int slot = reduce_slot(lane);
  const bool writer = slot >= 0 && (lane & 1) == 0;
  const int px = blockIdx.x * kTileSize + tid % kTileSize;
  const int py = blockIdx.y * kTileSize + tid / kTileSize * P;
  const float cx = static_cast<float>(px) + 0.5f;
  const int2 range = in.ranges[blockIdx.y * in.tiles_x + blockIdx.x];

  PixelWalk pix[P];
  int last = 0;  // the largest of this thread's pixels
#pragma unroll
  for (int k = 0; k < P; ++k) {
    pix[k] = start_walk(in, gr, px, py + k);
    last = max(last, pix[k].last);
  }
  const int warp_last = __reduce_max_sync(kFullMask, last);  // the Gaussians the warp walks
  if (tid == 0) s_last = 0;
  __syncthreads();
  if (lane == 0 && warp_last > 0) atomicMin(&s_last, -warp_last);  // s_last = -max(last)
  __syncthreads();
  const int stop = range.x - s_last;

  int parity = 0;
  for (int end = stop; end > range.x; end -= kThreads) {
    const int start = max(range.x, end - kThreads);
    const int count = end - start;
    __syncthreads();  // the previous batch is consumed (walked and flushed)
    if (tid < count) {
      const int id = in.ids[start + tid];
      const float* co = in.conics + 3 * static_cast<int64_t>(id);
      const float* c = in.rgb + 3 * static_cast<int64_t>(id);
      StagedGaussian& sg = s_gauss[tid];
      sg.id = id;
      sg.xy = in.means2d[id];
      const float opacity = in.opacities[id];
      sg.coef = exponent_coefficients(co, opacity);
      sg.conic = make_float4(co[0], co[1], co[2], opacity);
      sg.color = make_float4(c[0], c[1], c[2], in.depths[id]);
    }
    __syncthreads();
    const int offset = start - range.x;  // list position of s_gauss[0]
    for (int sub_end = count; sub_end > 0; sub_end -= kSub) {
      const int sub_start = max(0, sub_end - kSub);
      // walked back to front: sg (the Gaussian at list position pos) and out (where the warp
      // stores its sums; writers only) are decremented together
      const StagedGaussian* sg = s_gauss + sub_end;
      float* out = s_part[parity][warp] + max(slot, 0) + (sub_end - sub_start) * kGradValues;
      for (int pos = offset + sub_end - 1; pos >= offset + sub_start; --pos) {
        --sg;
        out -= kGradValues;
        float sum = 0.0f;
        if (pos < warp_last) {  // uniform over the warp
          const float2 xy = sg->xy;
          const float4 coef = sg->coef;
          const ExponentColumn col = exponent_column(coef, xy.x, cx);
          PixelAlpha e[P];
          bool took = false;
#pragma unroll
          for (int k = 0; k < P; ++k) {
            e[k] = pixel_alpha(pix[k], col, coef, xy.y, pos);
            took |= e[k].take;
          }
          if (__any_sync(kFullMask, took)) {
            const float4 cd = sg->color;
            float v[kGradValues];
#pragma unroll
            for (int k = 0; k < P; ++k) undo_gaussian(pix[k], e[k], col.dx, cd, k == 0, v);
            sum = warp_reduce_scatter(v, lane);
          }
        }
        if (writer) *out = sum;
      }
      __syncthreads();  // every warp's sums of this group are in s_part[parity]
      // flush: the block's sum of each value of each Gaussian of the group, one atomicAdd
      // (none where the tile's pixels gave it nothing)
      for (int e = tid; e < (sub_end - sub_start) * kGradValues; e += kThreads) {
        const int k = e % kGradValues;
        const int g = sub_start + e / kGradValues;
        float sum = 0.0f, pair = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += s_part[parity][w][e];
        if (k < 2) {
#pragma unroll
          for (int w = 0; w < kWarps; ++w) pair += s_part[parity][w][e ^ 1];
        }
        const float total = flush_value(k, sum, pair, s_gauss[g].conic);
        if (total != 0.0f) atomicAdd(grad_slot(gr, s_gauss[g].id, k), total);
      }
      parity ^= 1;
    }
  }
}

// d basis / d direction, accumulated: gdir += sum_k gb[k] d basis_k / d (x, y, z) (float32).
__device__ __forceinline__ void sh_basis_backward(int degree, float x, float y, float z,
                                                  const float* gb, float gdir[3]) {
  constexpr float c1 = kC1, c2a = kC2a, c2b = kC2b, c2c = kC2c, c3a = kC3a, c3b = kC3b,
                  c3c = kC3c, c3d = kC3d, c3e = kC3e;
  if (degree < 1) return;
  gdir[0] += -c1 * gb[3];
  gdir[1] += -c1 * gb[1];
  gdir[2] += c1 * gb[2];
  if (degree < 2) return;
  const float xx = x * x, yy = y * y, zz = z * z;
  gdir[0] += c2a * y * gb[4] - c2a * z * gb[7] - 2.0f * c2b * x * gb[6] + 2.0f * c2c * x * gb[8];
  gdir[1] += c2a * x * gb[4] - c2a * z * gb[5] - 2.0f * c2b * y * gb[6] - 2.0f * c2c * y * gb[8];
  gdir[2] += -c2a * y * gb[5] + 4.0f * c2b * z * gb[6] - c2a * x * gb[7];
  if (degree < 3) return;
  gdir[0] += -6.0f * c3a * x * y * gb[9] + c3b * y * z * gb[10] + 2.0f * c3c * x * y * gb[11] -
             6.0f * c3d * x * z * gb[12] - c3c * (4.0f * zz - 3.0f * xx - yy) * gb[13] +
             2.0f * c3e * x * z * gb[14] - 3.0f * c3a * (xx - yy) * gb[15];
  gdir[1] += -3.0f * c3a * (xx - yy) * gb[9] + c3b * x * z * gb[10] -
             c3c * (4.0f * zz - xx - 3.0f * yy) * gb[11] - 6.0f * c3d * y * z * gb[12] +
             2.0f * c3c * x * y * gb[13] - 2.0f * c3e * y * z * gb[14] +
             6.0f * c3a * x * y * gb[15];
  gdir[2] += c3b * x * y * gb[10] - 8.0f * c3c * y * z * gb[11] +
             c3d * (6.0f * zz - 3.0f * xx - 3.0f * yy) * gb[12] - 8.0f * c3c * x * z * gb[13] +
             c3e * (xx - yy) * gb[14];
}

// d loss / d (scale, quaternion) and d loss / d z, d loss / d (u, v) (added to g_zs, g_u, g_v)
// through the conic of one visible Gaussian, in float32. The decisions (the Jacobian clamp)
// come from float64 as in the forward; the 2D covariance's determinant is formed as a sum of
// non-negative terms, (a' + l)(c' + l) - b'^2 = |A0 x A1|^2 + l (a' + c') + l^2 (Lagrange's
// identity, A = T R S, a' = |A0|^2, ...), so that it keeps float32's relative precision where
// ca cc - cb^2 would cancel (thin Gaussians).
template <typename P>
__device__ __forceinline__ void covariance_backward(const ProjectGrads& a, int64_t i,
                                                    const CameraPoint& cam, const EwaClamp& cl,
                                                    float& g_zs, float& g_u, float& g_v,
                                                    float g_scale[3], float g_quat[4]) {
  const double iz_d = 1.0 / cam.z;
  const float iz = static_cast<float>(iz_d);
  const float jx = static_cast<float>(cam.fx * iz_d), jy = static_cast<float>(cam.fy * iz_d);
  const float jxz = static_cast<float>(-cam.fx * cl.uc * iz_d);
  const float jyz = static_cast<float>(-cam.fy * cl.vc * iz_d);
  const float* V = a.viewmat;  // W[r][k] = V[4 r + k]
  float T[2][3];
  for (int k = 0; k < 3; ++k) {
    T[0][k] = jx * V[k] + jxz * V[8 + k];
    T[1][k] = jy * V[4 + k] + jyz * V[8 + k];
  }
  const P* qp = static_cast<const P*>(a.rotations) + 4 * i;  // P: the parameters' type
  const P* sp = static_cast<const P*>(a.scales) + 3 * i;
  const float s[3] = {to_float(sp[0]), to_float(sp[1]), to_float(sp[2])};
  const float q_raw[4] = {to_float(qp[0]), to_float(qp[1]), to_float(qp[2]), to_float(qp[3])};
  const float qn = fmaxf(sqrtf(q_raw[0] * q_raw[0] + q_raw[1] * q_raw[1] +
                               q_raw[2] * q_raw[2] + q_raw[3] * q_raw[3]), 1e-12f);
  float q[4];
  for (int k = 0; k < 4; ++k) q[k] = q_raw[k] / qn;
  const float w = q[0], x = q[1], y = q[2], zq = q[3];
  const float R[3][3] = {{1.0f - 2.0f * (y * y + zq * zq), 2.0f * (x * y - w * zq),
                          2.0f * (x * zq + w * y)},
                         {2.0f * (x * y + w * zq), 1.0f - 2.0f * (x * x + zq * zq),
                          2.0f * (y * zq - w * x)},
                         {2.0f * (x * zq - w * y), 2.0f * (y * zq + w * x),
                          1.0f - 2.0f * (x * x + y * y)}};
  float A[2][3];  // T R diag(s)
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      A[r][c] = (T[r][0] * R[0][c] + T[r][1] * R[1][c] + T[r][2] * R[2][c]) * s[c];
    }
  }
  constexpr float lp = static_cast<float>(kLowPass);
  const float ca0 = A[0][0] * A[0][0] + A[0][1] * A[0][1] + A[0][2] * A[0][2];
  const float cc0 = A[1][0] * A[1][0] + A[1][1] * A[1][1] + A[1][2] * A[1][2];
  const float cb = A[0][0] * A[1][0] + A[0][1] * A[1][1] + A[0][2] * A[1][2];
  const float x0 = A[0][1] * A[1][2] - A[0][2] * A[1][1];
  const float x1 = A[0][2] * A[1][0] - A[0][0] * A[1][2];
  const float x2 = A[0][0] * A[1][1] - A[0][1] * A[1][0];
  const float det = (x0 * x0 + x1 * x1 + x2 * x2) + lp * (ca0 + cc0) + lp * lp;
  const float idet = 1.0f / det;
  const float C00 = (cc0 + lp) * idet, C01 = -cb * idet, C11 = (ca0 + lp) * idet;
  // conic C = cov^-1: d loss / d cov = H = -C G C, G the symmetric gradient of C
  // [[gA, gB / 2], [gB / 2, gC]]; then d/da = H00, d/db = 2 H01, d/dc = H11.
  const float* gk = a.g_conics + 3 * i;
  const float G00 = gk[0], G01 = 0.5f * gk[1], G11 = gk[2];
  const float P00 = C00 * G00 + C01 * G01, P01 = C00 * G01 + C01 * G11;
  const float P10 = C01 * G00 + C11 * G01, P11 = C01 * G01 + C11 * G11;
  const float H00 = -(P00 * C00 + P01 * C01), H01 = -(P00 * C01 + P01 * C11);
  const float H11 = -(P10 * C01 + P11 * C11);
  // cov = A A^T + l I: dL/dA = 2 H A
  float gA[2][3];
  for (int c = 0; c < 3; ++c) {
    gA[0][c] = 2.0f * (H00 * A[0][c] + H01 * A[1][c]);
    gA[1][c] = 2.0f * (H01 * A[0][c] + H11 * A[1][c]);
  }
  // A = T M, M = R diag(s): dL/dT = gA M^T, dL/dM = T^T gA
  float gT[2][3];
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      gT[r][c] = (gA[r][0] * R[c][0]) * s[0] + (gA[r][1] * R[c][1]) * s[1] +
                 (gA[r][2] * R[c][2]) * s[2];
    }
  }
  float gR[3][3];
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      const float gM = T[0][r] * gA[0][c] + T[1][r] * gA[1][c];
      g_scale[c] += gM * R[r][c];
      gR[r][c] = gM * s[c];
    }
  }
  float gq[4];
  gq[0] = 2.0f * (-zq * gR[0][1] + y * gR[0][2] + zq * gR[1][0] - x * gR[1][2] - y * gR[2][0] +
                  x * gR[2][1]);
  gq[1] = 2.0f * (y * gR[0][1] + zq * gR[0][2] + y * gR[1][0] - 2.0f * x * gR[1][1] -
                  w * gR[1][2] + zq * gR[2][0] + w * gR[2][1] - 2.0f * x * gR[2][2]);
  gq[2] = 2.0f * (-2.0f * y * gR[0][0] + x * gR[0][1] + w * gR[0][2] + x * gR[1][0] +
                  zq * gR[1][2] - w * gR[2][0] + zq * gR[2][1] - 2.0f * y * gR[2][2]);
  gq[3] = 2.0f * (-2.0f * zq * gR[0][0] - w * gR[0][1] + x * gR[0][2] + w * gR[1][0] -
                  2.0f * zq * gR[1][1] + y * gR[1][2] + x * gR[2][0] + y * gR[2][1]);
  const float dot = q[0] * gq[0] + q[1] * gq[1] + q[2] * gq[2] + q[3] * gq[3];
  for (int k = 0; k < 4; ++k) g_quat[k] = (gq[k] - q[k] * dot) / qn;
  // T = J W: dL/dJ = gT W^T; J = [[fx / z, 0, -fx uc / z], [0, fy / z, -fy vc / z]]
  float gJ[2][3];
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      gJ[r][c] = gT[r][0] * V[4 * c] + gT[r][1] * V[4 * c + 1] + gT[r][2] * V[4 * c + 2];
    }
  }
  g_zs -= iz * (jx * gJ[0][0] + jxz * gJ[0][2] + jy * gJ[1][1] + jyz * gJ[1][2]);
  if (cl.u_free) g_u -= jx * gJ[0][2];
  if (cl.v_free) g_v -= jy * gJ[1][2];
}

// The SH part of one Gaussian's project backward: from the colour gradient grgb to the SH
// coefficients' gradient (into gcp, every value of the row written) and to the mean (added
// to g_m). cp / gcp: the row in shared memory (float) or in global memory (the parameters'
// type); cp may alias gcp.
template <typename P, typename G>
__device__ __forceinline__ void sh_backward(const ProjectGrads& a, const double dir_d[3],
                                            float dn, const P* cp, G* gcp, const float* grgb,
                                            float g_m[3]) {
  // the forward's colour sums in float64 (the same clamp decision), the rest in float32
  double s[3];
  sh_sums(a.sh_degree, dir_d, cp, s);
  const float dir[3] = {static_cast<float>(dir_d[0]), static_cast<float>(dir_d[1]),
                        static_cast<float>(dir_d[2])};
  float basis[16] = {};
  const int count = sh_basis(a.sh_degree, dir[0], dir[1], dir[2], basis);
  float g_s[3];
  for (int ch = 0; ch < 3; ++ch) g_s[ch] = s[ch] + 0.5 >= 0.0 ? grgb[ch] : 0.0f;  // clamp_min
  float g_basis[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    g_basis[k] = 0.0f;
    if (k < count) {
      g_basis[k] = to_float(cp[3 * k]) * g_s[0] + to_float(cp[3 * k + 1]) * g_s[1] +
                   to_float(cp[3 * k + 2]) * g_s[2];
    }
  }
  // cp may alias gcp (the staged row): every read of cp is above
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    if (k < a.sh_coeffs) {
#pragma unroll
      for (int ch = 0; ch < 3; ++ch) {
        gcp[3 * k + ch] = from_float<G>(k < count ? basis[k] * g_s[ch] : 0.0f);
      }
    }
  }
  for (int k = 16; k < a.sh_coeffs; ++k) {  // coefficients beyond degree 3: no gradient
    for (int ch = 0; ch < 3; ++ch) gcp[3 * k + ch] = from_float<G>(0.0f);
  }
  float g_dir[3] = {0.0f, 0.0f, 0.0f};
  sh_basis_backward(a.sh_degree, dir[0], dir[1], dir[2], g_basis, g_dir);
  const float proj = dir[0] * g_dir[0] + dir[1] * g_dir[1] + dir[2] * g_dir[2];
  for (int c = 0; c < 3; ++c) g_m[c] += (g_dir[c] - dir[c] * proj) / dn;
}

// One Gaussian of project_backward_kernel; sh_row: its SH coefficients staged in shared
// memory, where its SH gradient is written back (nullptr: RGB colours, or more coefficients
// than are staged: global memory). T: the parameters' (and their gradients') element type;
// the gradients are computed in float32 and rounded once, at the store.
template <typename T>
__device__ __forceinline__ void project_backward_one(const ProjectGrads& a, int i,
                                                     float* sh_row) {
  const int64_t i64 = i;
  const T* mp = static_cast<const T*>(a.means) + 3 * i64;
  const float mean[3] = {to_float(mp[0]), to_float(mp[1]), to_float(mp[2])};
  const CameraPoint cam = world_to_camera(a.viewmat, a.intrinsics, mean);
  const float* V = a.viewmat;
  const float zs = static_cast<float>(cam.zs);
  const bool visible = a.radii[i] > 0;  // the conic exists (and carries a gradient)
  const EwaClamp cl = visible ? ewa_clamp(cam, a.width, a.height) : EwaClamp{};
  // the SH view direction first: the float64 camera quantities are not needed after it
  double dir_d[3] = {0.0, 0.0, 0.0};
  const float dn = a.sh_degree >= 0 ? static_cast<float>(view_direction(cam, dir_d)) : 1.0f;

  float g_u = a.g_means2d[2 * i64] * a.intrinsics[0];  // means2d = (fx u + cx, fy v + cy)
  float g_v = a.g_means2d[2 * i64 + 1] * a.intrinsics[4];
  float g_zs = 0.0f;
  float g_scale[3] = {0.0f, 0.0f, 0.0f};
  float g_quat[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (visible) covariance_backward<T>(a, i64, cam, cl, g_zs, g_u, g_v, g_scale, g_quat);
  T* g_scales = static_cast<T*>(a.g_scales) + 3 * i64;
  T* g_rotations = static_cast<T*>(a.g_rotations) + 4 * i64;
  for (int c = 0; c < 3; ++c) g_scales[c] = from_float<T>(g_scale[c]);
  for (int k = 0; k < 4; ++k) g_rotations[k] = from_float<T>(g_quat[k]);
  if (a.g_opacities_f32 != nullptr) {  // 16-bit parameters: render's float32 copy's gradient
    static_cast<T*>(a.g_opacities)[i] = from_float<T>(a.g_opacities_f32[i]);
  }

  // u = p0 / zs, v = p1 / zs, depth = z
  float g_p[3];
  g_p[0] = g_u / zs;
  g_p[1] = g_v / zs;
  g_zs -= (g_u * static_cast<float>(cam.u) + g_v * static_cast<float>(cam.v)) / zs;
  g_p[2] = a.g_depths[i] + (cam.in_front ? g_zs : 0.0f);
  float g_m[3];
  for (int c = 0; c < 3; ++c) g_m[c] = V[c] * g_p[0] + V[4 + c] * g_p[1] + V[8 + c] * g_p[2];

  // colour
  const float* grgb = a.g_rgb + 3 * i64;
  if (a.sh_degree < 0) {
    T* g_colors = static_cast<T*>(a.g_colors) + 3 * i64;
    for (int ch = 0; ch < 3; ++ch) g_colors[ch] = from_float<T>(grgb[ch]);
  } else if (sh_row != nullptr) {
    sh_backward(a, dir_d, dn, sh_row, sh_row, grgb, g_m);
  } else {
    const int64_t values = 3 * static_cast<int64_t>(a.sh_coeffs);
    sh_backward(a, dir_d, dn, static_cast<const T*>(a.colors) + values * i64,
                static_cast<T*>(a.g_colors) + values * i64, grgb, g_m);
  }

  T* g_means = static_cast<T*>(a.g_means) + 3 * i64;
  for (int c = 0; c < 3; ++c) g_means[c] = from_float<T>(g_m[c]);
}

// One thread per Gaussian, float32 but for the decisions; each warp stages the SH rows of its
// 32 Gaussians in shared memory (coalesced), and writes their gradients back the same way.
// T: the parameters' element type.
template <typename T>
__global__ void __launch_bounds__(kProjectThreads) project_backward_kernel(const ProjectGrads a) {
  __shared__ float s_sh[kProjectThreads * kShRowStride];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32;
  const int64_t warp_first = static_cast<int64_t>(i) - lane;
  const int rows = static_cast<int>(min(static_cast<int64_t>(32), a.n - warp_first));
  const bool staged = a.sh_degree >= 0 && a.sh_coeffs <= kShStagedCoeffs;
  float* warp_rows = s_sh + (threadIdx.x - lane) * kShRowStride;
  const int len = 3 * a.sh_coeffs;
  if (staged && rows > 0) {
    warp_copy_rows<true>(static_cast<const T*>(a.colors), warp_rows, warp_first, rows, len,
                         lane);
  }
  __syncwarp();
  if (i == 0 && a.g_background_f32 != nullptr) {  // 16-bit parameters: the background's
    for (int k = 0; k < 3; ++k) {
      static_cast<T*>(a.g_background)[k] = from_float<T>(a.g_background_f32[k]);
    }
  }
  if (i < a.n) {
    project_backward_one<T>(a, i, staged ? s_sh + threadIdx.x * kShRowStride : nullptr);
  }
  __syncwarp();
  if (staged && rows > 0) {
    warp_copy_rows<false>(static_cast<T*>(a.g_colors), warp_rows, warp_first, rows, len, lane);
  }
}

}  // namespace

void launch_render_backward(const SplatInputs& in, const RenderGrads& g, int pixels_per_thread,
                            cudaStream_t stream) {
  const dim3 grid(in.tiles_x, in.tiles_y);
  if (pixels_per_thread == 4) {
    render_backward_kernel<4><<<grid, kBlockPixels / 4, 0, stream>>>(in, g);
  } else {
    render_backward_kernel<2><<<grid, kBlockPixels / 2, 0, stream>>>(in, g);
  }
}

void launch_project_backward(const ProjectGrads& g, cudaStream_t stream) {
  const int grid = static_cast<int>((static_cast<int64_t>(g.n) + kProjectThreads - 1) /
                                    kProjectThreads);
  switch (g.scalar) {
    case Scalar::kBFloat16:
      project_backward_kernel<__nv_bfloat16><<<grid, kProjectThreads, 0, stream>>>(g);
      break;
    case Scalar::kFloat16:
      project_backward_kernel<__half><<<grid, kProjectThreads, 0, stream>>>(g);
      break;
    default:
      project_backward_kernel<float><<<grid, kProjectThreads, 0, stream>>>(g);
      break;
  }
}

}  // namespace gpucheck::splat
