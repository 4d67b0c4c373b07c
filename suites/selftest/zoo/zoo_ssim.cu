// gpucheck's self-test zoo: the kernels of an SSIM loss in the shape of fused-ssim (11x11
// Gaussian window, sigma 1.5, zero padding; the forward saves the partial derivatives of the
// map that the backward gathers through a shared-memory tile), one source for the clean build
// and every defect build.
//   GPUCHECK_ZOO_LEGACY_STREAM  the forward kernel launched with <<<grid, block>>>
//   GPUCHECK_ZOO_NO_SYNC        the backward reads its shared-memory tile without the barrier
//                               after the block's threads store it (a race)
#include "zoo_stream.cuh"

#include <cstdint>

namespace TORCH_EXTENSION_NAME {
namespace {

constexpr int kRadius = 5;
constexpr int kBlock = 16;                     // threads per block side
constexpr int kHalo = kBlock + 2 * kRadius;    // a block's tile with its window's halo
__constant__ float kWindow[2 * kRadius + 1] = {
    0.001028380f, 0.007598758f, 0.036000773f, 0.109360688f, 0.213005537f, 0.266011724f,
    0.213005537f, 0.109360688f, 0.036000773f, 0.007598758f, 0.001028380f};

struct Image {
  int planes, height, width;  // planes = batch * channels
  __device__ float at(const float* p, int plane, int y, int x) const {
    return (y < 0 || y >= height || x < 0 || x >= width) ? 0.f
                                                         : p[(plane * height + y) * width + x];
  }
};

// One thread per pixel of every plane: the window's moments, the map and (train) its partials.
__global__ void ssim_forward_kernel(Image im, float C1, float C2, const float* img1,
                                    const float* img2, float* map, float* dm_dmu1,
                                    float* dm_dsigma1_sq, float* dm_dsigma12) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int plane = blockIdx.z;
  if (x >= im.width || y >= im.height) return;
  float mu1 = 0.f, mu2 = 0.f, e11 = 0.f, e22 = 0.f, e12 = 0.f;
  for (int dy = -kRadius; dy <= kRadius; ++dy) {
    for (int dx = -kRadius; dx <= kRadius; ++dx) {
      const float w = kWindow[dy + kRadius] * kWindow[dx + kRadius];
      const float a = im.at(img1, plane, y + dy, x + dx), b = im.at(img2, plane, y + dy, x + dx);
      mu1 += w * a;
      mu2 += w * b;
      e11 += w * a * a;
      e22 += w * b * b;
      e12 += w * a * b;
    }
  }
  const float s1 = e11 - mu1 * mu1, s2 = e22 - mu2 * mu2, s12 = e12 - mu1 * mu2;
  const float A = 2.f * mu1 * mu2 + C1, B = 2.f * s12 + C2;
  const float C = mu1 * mu1 + mu2 * mu2 + C1, D = s1 + s2 + C2;
  const int i = (plane * im.height + y) * im.width + x;
  map[i] = (A * B) / (C * D);
  if (dm_dmu1 != nullptr) {
    const float d_mu1 = 2.f * mu2 * B / (C * D) - 2.f * mu1 * A * B / (C * C * D);
    const float d_s1 = -A * B / (C * D * D);
    const float d_s12 = 2.f * A / (C * D);
    dm_dmu1[i] = d_mu1 - 2.f * mu1 * d_s1 - mu2 * d_s12;
    dm_dsigma1_sq[i] = d_s1;
    dm_dsigma12[i] = d_s12;
  }
}

// dL/dimg1: a gather over the window (no atomics). The block first stores the three terms
// dL/dmap * dmap/d(mu1, sigma1^2, sigma12) of its tile and halo in shared memory, every
// thread a few, then each thread gathers its window from there.
__global__ void ssim_backward_kernel(Image im, const float* img1, const float* img2,
                                     const float* dL_dmap, const float* dm_dmu1,
                                     const float* dm_dsigma1_sq, const float* dm_dsigma12,
                                     float* dL_dimg1) {
  __shared__ float t_mu1[kHalo][kHalo];
  __shared__ float t_s11[kHalo][kHalo];
  __shared__ float t_s12[kHalo][kHalo];
  const int plane = blockIdx.z;
  const int x0 = blockIdx.x * kBlock - kRadius, y0 = blockIdx.y * kBlock - kRadius;
  for (int k = threadIdx.y * kBlock + threadIdx.x; k < kHalo * kHalo; k += kBlock * kBlock) {
    const int ly = k / kHalo, lx = k % kHalo;
    const int qy = y0 + ly, qx = x0 + lx;
    float mu1 = 0.f, s11 = 0.f, s12 = 0.f;
    if (qy >= 0 && qy < im.height && qx >= 0 && qx < im.width) {
      const int q = (plane * im.height + qy) * im.width + qx;
      const float d = dL_dmap[q];
      mu1 = d * dm_dmu1[q];
      s11 = d * dm_dsigma1_sq[q];
      s12 = d * dm_dsigma12[q];
    }
    t_mu1[ly][lx] = mu1;
    t_s11[ly][lx] = s11;
    t_s12[ly][lx] = s12;
  }
#ifndef GPUCHECK_ZOO_NO_SYNC
  __syncthreads();
#endif  // Defect (GPUCHECK_ZOO_NO_SYNC): other warps' parts of the tile read before stored
  const int x = blockIdx.x * kBlock + threadIdx.x;
  const int y = blockIdx.y * kBlock + threadIdx.y;
  if (x >= im.width || y >= im.height) return;
  const int i = (plane * im.height + y) * im.width + x;
  const float a = img1[i], b = img2[i];
  float g = 0.f;
  for (int dy = -kRadius; dy <= kRadius; ++dy) {
    for (int dx = -kRadius; dx <= kRadius; ++dx) {
      const int ly = threadIdx.y + kRadius + dy, lx = threadIdx.x + kRadius + dx;
      const float w = kWindow[dy + kRadius] * kWindow[dx + kRadius];
      g += w * (t_mu1[ly][lx] + 2.f * a * t_s11[ly][lx] + b * t_s12[ly][lx]);
    }
  }
  dL_dimg1[i] = g;
}

dim3 grid_of(const Image& im, dim3 block) {
  return dim3((im.width + block.x - 1) / block.x, (im.height + block.y - 1) / block.y,
              im.planes);
}

}  // namespace

cudaError_t ssim_forward_launch(int planes, int height, int width, float C1, float C2,
                                const float* img1, const float* img2, float* map,
                                float* dm_dmu1, float* dm_dsigma1_sq, float* dm_dsigma12,
                                cudaStream_t stream) {
  const Image im{planes, height, width};
  const dim3 block(16, 16);
  if (planes == 0 || height == 0 || width == 0) return cudaSuccess;
#ifdef GPUCHECK_ZOO_LEGACY_STREAM
  cudaError_t err = zoo_legacy_enter(stream);
  if (err != cudaSuccess) return err;
  ssim_forward_kernel<<<grid_of(im, block), block>>>(  // Defect: the legacy default stream
      im, C1, C2, img1, img2, map, dm_dmu1, dm_dsigma1_sq, dm_dsigma12);
  err = cudaGetLastError();
  return err != cudaSuccess ? err : zoo_legacy_exit();
#else
  ssim_forward_kernel<<<grid_of(im, block), block, 0, stream>>>(
      im, C1, C2, img1, img2, map, dm_dmu1, dm_dsigma1_sq, dm_dsigma12);
  return cudaGetLastError();
#endif
}

cudaError_t ssim_backward_launch(int planes, int height, int width, const float* img1,
                                 const float* img2, const float* dL_dmap, const float* dm_dmu1,
                                 const float* dm_dsigma1_sq, const float* dm_dsigma12,
                                 float* dL_dimg1, cudaStream_t stream) {
  const Image im{planes, height, width};
  const dim3 block(kBlock, kBlock);  // the kernel's tile is kBlock x kBlock threads
  if (planes == 0 || height == 0 || width == 0) return cudaSuccess;
  ssim_backward_kernel<<<grid_of(im, block), block, 0, stream>>>(
      im, img1, img2, dL_dmap, dm_dmu1, dm_dsigma1_sq, dm_dsigma12, dL_dimg1);
  return cudaGetLastError();
}

}  // namespace TORCH_EXTENSION_NAME
