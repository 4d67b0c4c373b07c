// gpucheck's self-test zoo: the rasterizer's kernels (zoo_raster.h), one source for the clean
// build and every defect build. Defects (never define them in real code):
//   GPUCHECK_ZOO_LEGACY_STREAM   the render kernel launched with <<<grid, block>>>
//   GPUCHECK_ZOO_SORT_STREAM0    cub::DeviceRadixSort::SortPairs without its stream argument
//   GPUCHECK_ZOO_LEAK            the backward's staging buffer (raw cudaMalloc) never freed
//   GPUCHECK_ZOO_MASK_UNWRITTEN  the tiles a mask leaves out get the background but their
//                                alpha and last index are never written (at::empty's bytes)
#include "zoo_raster.h"
#include "zoo_stream.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>

namespace TORCH_EXTENSION_NAME {
namespace {

constexpr float kSH_C0 = 0.28209479177387814f;
//: exp(-0.5 * 3.3^2): a Gaussian's weight is exp(power) - kCut, clamped at 0, so that its
//: footprint ends smoothly inside its radius (ceil(3.5 sigma)) and no tile outside misses it
constexpr float kCut = 0.004307425f;
constexpr size_t kStagingBytes = size_t(16) << 20;

#define ZOO_TRY(call)                          \
  do {                                         \
    cudaError_t zoo_err_ = (call);             \
    if (zoo_err_ != cudaSuccess) return zoo_err_; \
  } while (0)

template <typename T>
void obtain(char*& chunk, T*& ptr, size_t count, size_t alignment) {
  size_t offset = (reinterpret_cast<uintptr_t>(chunk) + alignment - 1) & ~(alignment - 1);
  ptr = reinterpret_cast<T*>(offset);
  chunk = reinterpret_cast<char*>(ptr + count);
}

struct GeometryState {
  float* depths;
  int* radii;
  int4* rect;  // tiles [x0, y0, x1, y1)
  float* rgb;  // [P, 3]
  uint32_t* tiles_touched;
  uint32_t* point_offsets;
  size_t scan_size;
  char* scan_temp;

  static GeometryState fromChunk(char*& chunk, size_t P) {
    GeometryState g;
    obtain(chunk, g.depths, P, 128);
    obtain(chunk, g.radii, P, 128);
    obtain(chunk, g.rect, P, 128);
    obtain(chunk, g.rgb, P * 3, 128);
    obtain(chunk, g.tiles_touched, P, 128);
    obtain(chunk, g.point_offsets, P, 128);
    cub::DeviceScan::InclusiveSum(nullptr, g.scan_size, g.tiles_touched, g.tiles_touched,
                                  static_cast<int>(P));
    obtain(chunk, g.scan_temp, g.scan_size, 128);
    return g;
  }
};

struct BinningState {
  uint64_t* keys_unsorted;
  uint64_t* keys;
  uint32_t* values_unsorted;
  uint32_t* values;
  size_t sort_size;
  char* sort_temp;

  static BinningState fromChunk(char*& chunk, size_t L) {
    BinningState b;
    obtain(chunk, b.keys_unsorted, L, 128);
    obtain(chunk, b.keys, L, 128);
    obtain(chunk, b.values_unsorted, L, 128);
    obtain(chunk, b.values, L, 128);
    cub::DeviceRadixSort::SortPairs(nullptr, b.sort_size, b.keys_unsorted, b.keys,
                                    b.values_unsorted, b.values, static_cast<int>(L));
    obtain(chunk, b.sort_temp, b.sort_size, 128);
    return b;
  }
};

struct ImageState {
  uint2* ranges;     // [tiles]
  float* final_T;    // [H * W]

  static ImageState fromChunk(char*& chunk, size_t pixels, size_t tiles) {
    ImageState s;
    obtain(chunk, s.ranges, tiles, 128);
    obtain(chunk, s.final_T, pixels, 128);
    return s;
  }
};

template <typename State, typename... Sizes>
size_t required(Sizes... sizes) {
  char* size = nullptr;
  State::fromChunk(size, sizes...);
  return reinterpret_cast<size_t>(size) + 128;
}

__device__ __forceinline__ float weight(float dx, float dy, float sigma, float opacity) {
  const float power = -0.5f * (dx * dx + dy * dy) / (sigma * sigma);
  return fminf(0.99f, opacity * fmaxf(0.f, __expf(power) - kCut));
}

__global__ void preprocess_kernel(RasterArgs a, int grid_x, int grid_y, GeometryState g) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.P) return;
  g.radii[i] = 0;
  g.tiles_touched[i] = 0;
  const float depth = a.depths[i];
  g.depths[i] = depth;
  if (!(depth > kNear)) return;
  const float r = ceilf(3.5f * fminf(a.sigmas[i], 1e6f));
  const float u = a.means2D[2 * i], v = a.means2D[2 * i + 1];
  const int x0 = max(0, static_cast<int>(floorf((u - r) / kTile)));
  const int y0 = max(0, static_cast<int>(floorf((v - r) / kTile)));
  const int x1 = min(grid_x, static_cast<int>(floorf((u + r) / kTile)) + 1);
  const int y1 = min(grid_y, static_cast<int>(floorf((v + r) / kTile)) + 1);
  if (x1 <= x0 || y1 <= y0) return;
  for (int c = 0; c < 3; ++c) {
    g.rgb[3 * i + c] = a.colors != nullptr ? a.colors[3 * i + c]
                                           : fmaxf(0.f, 0.5f + kSH_C0 * a.sh_dc[3 * i + c]);
  }
  g.radii[i] = static_cast<int>(r);
  g.rect[i] = make_int4(x0, y0, x1, y1);
  g.tiles_touched[i] = static_cast<uint32_t>((x1 - x0) * (y1 - y0));
}

__global__ void duplicate_with_keys_kernel(int P, GeometryState g, int grid_x,
                                           uint64_t* keys, uint32_t* values) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P || g.radii[i] == 0) return;
  uint32_t off = i == 0 ? 0 : g.point_offsets[i - 1];
  const int4 r = g.rect[i];
  const uint32_t depth_bits = __float_as_uint(g.depths[i]);  // positive: ordered as floats
  for (int y = r.y; y < r.w; ++y) {
    for (int x = r.x; x < r.z; ++x) {
      keys[off] = (static_cast<uint64_t>(y * grid_x + x) << 32) | depth_bits;
      values[off] = static_cast<uint32_t>(i);
      ++off;
    }
  }
}

__global__ void identify_tile_ranges_kernel(int L, const uint64_t* keys, uint2* ranges) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= L) return;
  const uint32_t tile = static_cast<uint32_t>(keys[i] >> 32);
  if (i == 0) {
    ranges[tile].x = 0;
  } else {
    const uint32_t prev = static_cast<uint32_t>(keys[i - 1] >> 32);
    if (tile != prev) {
      ranges[prev].y = i;
      ranges[tile].x = i;
    }
  }
  if (i == L - 1) ranges[tile].y = L;
}

__device__ __forceinline__ bool masked(const RasterArgs& a, int tile) {
  return a.tile_mask != nullptr && !a.tile_mask[tile];
}

// One thread per pixel, one block per tile: front to back over the tile's sorted list.
__global__ void render_kernel(RasterArgs a, int grid_x, const uint2* ranges,
                              const uint32_t* point_list, GeometryState g, float* final_T,
                              float* out_color, float* out_alpha, int* out_last) {
  const int px = blockIdx.x * kTile + threadIdx.x, py = blockIdx.y * kTile + threadIdx.y;
  if (px >= a.width || py >= a.height) return;
  const int tile = blockIdx.y * grid_x + blockIdx.x;
  const int pix = py * a.width + px;
  if (masked(a, tile)) {  // not rendered: the background
    final_T[pix] = 1.f;
    for (int c = 0; c < 3; ++c) out_color[c * a.height * a.width + pix] = a.background[c];
#ifndef GPUCHECK_ZOO_MASK_UNWRITTEN
    out_alpha[pix] = 0.f;
    out_last[pix] = -1;
#endif  // Defect (GPUCHECK_ZOO_MASK_UNWRITTEN): alpha and last index left as at::empty made them
    return;
  }
  const uint2 range = ranges[tile];
  float T = 1.f, C[3] = {0.f, 0.f, 0.f};
  int last = -1;
  for (uint32_t k = range.x; k < range.y; ++k) {
    const uint32_t i = point_list[k];
    const float alpha = weight(px - a.means2D[2 * i], py - a.means2D[2 * i + 1], a.sigmas[i],
                               a.opacities[i]);
    if (alpha <= 0.f) continue;
    for (int c = 0; c < 3; ++c) C[c] += g.rgb[3 * i + c] * alpha * T;
    T *= 1.f - alpha;
    last = static_cast<int>(k);
  }
  final_T[pix] = T;
  for (int c = 0; c < 3; ++c) {
    out_color[c * a.height * a.width + pix] = C[c] + T * a.background[c];
  }
  out_alpha[pix] = 1.f - T;
  out_last[pix] = last;
}

// One thread per Gaussian: a gather over the pixels of its tiles (no atomics: the gradient
// is the same bit for bit on every call).
__global__ void backward_kernel(RasterArgs a, int grid_x, const uint2* ranges,
                                const uint32_t* point_list, GeometryState g,
                                const float* dL_dout, float* dL_dcolor) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.P) return;
  float grad[3] = {0.f, 0.f, 0.f};
  if (g.radii[i] > 0) {
    const int4 r = g.rect[i];
    for (int py = r.y * kTile; py < min(r.w * kTile, a.height); ++py) {
      for (int px = r.x * kTile; px < min(r.z * kTile, a.width); ++px) {
        if (masked(a, (py / kTile) * grid_x + px / kTile)) continue;  // not rendered
        const float mine = weight(px - a.means2D[2 * i], py - a.means2D[2 * i + 1],
                                  a.sigmas[i], a.opacities[i]);
        if (mine <= 0.f) continue;
        const uint2 range = ranges[(py / kTile) * grid_x + px / kTile];
        float T = 1.f;
        for (uint32_t k = range.x; k < range.y && point_list[k] != static_cast<uint32_t>(i);
             ++k) {
          const uint32_t j = point_list[k];
          const float alpha = weight(px - a.means2D[2 * j], py - a.means2D[2 * j + 1],
                                     a.sigmas[j], a.opacities[j]);
          if (alpha > 0.f) T *= 1.f - alpha;
        }
        const int pix = py * a.width + px;
        for (int c = 0; c < 3; ++c) grad[c] += dL_dout[c * a.height * a.width + pix] * mine * T;
      }
    }
  }
  for (int c = 0; c < 3; ++c) {
    const bool through_sh = a.colors == nullptr;
    const bool clamped = through_sh && 0.5f + kSH_C0 * a.sh_dc[3 * i + c] < 0.f;
    dL_dcolor[3 * i + c] = clamped ? 0.f : (through_sh ? kSH_C0 * grad[c] : grad[c]);
  }
}

unsigned blocks(int n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

int bit_width(uint32_t n) {
  int bits = 0;
  while (n) {
    ++bits;
    n >>= 1;
  }
  return bits;
}

cudaError_t sort_pairs(BinningState& b, int L, int end_bit, cudaStream_t stream) {
#ifdef GPUCHECK_ZOO_SORT_STREAM0
  // Defect: cub's sort without its stream argument (stream 0), as the original rasterizer
  ZOO_TRY(zoo_legacy_enter(stream));
  ZOO_TRY(cub::DeviceRadixSort::SortPairs(b.sort_temp, b.sort_size, b.keys_unsorted, b.keys,
                                          b.values_unsorted, b.values, L, 0, end_bit));
  return zoo_legacy_exit();
#else
  return cub::DeviceRadixSort::SortPairs(b.sort_temp, b.sort_size, b.keys_unsorted, b.keys,
                                         b.values_unsorted, b.values, L, 0, end_bit, stream);
#endif
}

cudaError_t render(const RasterArgs& a, dim3 tile_grid, const ImageState& img,
                   const BinningState& b, const GeometryState& g, float* out_color,
                   float* out_alpha, int* out_last, cudaStream_t stream) {
  const dim3 block(kTile, kTile);
#ifdef GPUCHECK_ZOO_LEGACY_STREAM
  ZOO_TRY(zoo_legacy_enter(stream));
  render_kernel<<<tile_grid, block>>>(a, tile_grid.x, img.ranges, b.values, g, img.final_T,
                                      out_color, out_alpha,
                                      out_last);  // Defect: the legacy default stream
  ZOO_TRY(cudaGetLastError());
  return zoo_legacy_exit();
#else
  render_kernel<<<tile_grid, block, 0, stream>>>(a, tile_grid.x, img.ranges, b.values, g,
                                                 img.final_T, out_color, out_alpha, out_last);
  return cudaGetLastError();
#endif
}

// One thread per Gaussian (gsplat's fully fused projection, isotropic): a Gaussian behind
// kNear or whose footprint misses the image is culled: radius 0, and its means2D, depth and
// conic are never written.
__global__ void project_kernel(ProjectArgs a, float* means2D, float* depths, float* conics,
                               int* radii) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.P) return;
  radii[i] = 0;
  const float x = a.means3D[3 * i], y = a.means3D[3 * i + 1], z = a.means3D[3 * i + 2];
  if (!(z > kNear)) return;
  const float scale = (__expf(a.log_scales[3 * i]) + __expf(a.log_scales[3 * i + 1]) +
                       __expf(a.log_scales[3 * i + 2])) / 3.f;
  const float sigma = fminf(a.focal * scale / z, 1e4f);
  const float u = a.focal * x / z + 0.5f * a.width, v = a.focal * y / z + 0.5f * a.height;
  const float r = ceilf(3.5f * sigma);
  if (!(sigma > 0.f) || u + r < 0.f || u - r > a.width || v + r < 0.f || v - r > a.height) {
    return;
  }
  means2D[2 * i] = u;
  means2D[2 * i + 1] = v;
  depths[i] = z;
  const float inv = 1.f / (sigma * sigma);
  conics[3 * i] = inv;
  conics[3 * i + 1] = 0.f;
  conics[3 * i + 2] = inv;
  radii[i] = max(1, static_cast<int>(r));
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("zoo rasterizer: ") + what + ": " +
                             cudaGetErrorString(err));
  }
}

}  // namespace

int rasterize_forward(const RasterArgs& a, std::function<char*(size_t)> geometry_buffer,
                      std::function<char*(size_t)> binning_buffer,
                      std::function<char*(size_t)> image_buffer, float* out_color,
                      float* out_alpha, int* out_last, int* radii, cudaStream_t stream) {
  const dim3 tile_grid((a.width + kTile - 1) / kTile, (a.height + kTile - 1) / kTile);
  const int tiles = static_cast<int>(tile_grid.x * tile_grid.y);
  char* geom_chunk = geometry_buffer(required<GeometryState>(static_cast<size_t>(a.P)));
  GeometryState g = GeometryState::fromChunk(geom_chunk, a.P);
  char* img_chunk = image_buffer(
      required<ImageState>(static_cast<size_t>(a.width) * a.height, static_cast<size_t>(tiles)));
  ImageState img = ImageState::fromChunk(img_chunk, static_cast<size_t>(a.width) * a.height,
                                         tiles);
  check(cudaMemsetAsync(img.ranges, 0, tiles * sizeof(uint2), stream), "ranges");

  preprocess_kernel<<<blocks(a.P, 256), 256, 0, stream>>>(a, tile_grid.x, tile_grid.y, g);
  check(cudaGetLastError(), "preprocess");
  check(cub::DeviceScan::InclusiveSum(g.scan_temp, g.scan_size, g.tiles_touched,
                                      g.point_offsets, a.P, stream), "scan");
  uint32_t num_rendered = 0;
  check(cudaMemcpyAsync(&num_rendered, g.point_offsets + a.P - 1, sizeof(uint32_t),
                        cudaMemcpyDeviceToHost, stream), "num_rendered");
  check(cudaMemcpyAsync(radii, g.radii, a.P * sizeof(int), cudaMemcpyDeviceToDevice, stream),
        "radii");
  check(cudaStreamSynchronize(stream), "num_rendered");

  const int L = static_cast<int>(num_rendered);
  char* bin_chunk = binning_buffer(required<BinningState>(static_cast<size_t>(L)));
  BinningState b = BinningState::fromChunk(bin_chunk, L);
  if (L > 0) {
    duplicate_with_keys_kernel<<<blocks(a.P, 256), 256, 0, stream>>>(
        a.P, g, tile_grid.x, b.keys_unsorted, b.values_unsorted);
    check(cudaGetLastError(), "duplicate_with_keys");
    check(sort_pairs(b, L, 32 + bit_width(static_cast<uint32_t>(tiles)), stream), "sort");
    identify_tile_ranges_kernel<<<blocks(L, 256), 256, 0, stream>>>(L, b.keys, img.ranges);
    check(cudaGetLastError(), "identify_tile_ranges");
  }
  check(render(a, tile_grid, img, b, g, out_color, out_alpha, out_last, stream), "render");
  return L;
}

void project_forward(const ProjectArgs& a, float* means2D, float* depths, float* conics,
                     int* radii, cudaStream_t stream) {
  project_kernel<<<blocks(a.P, 256), 256, 0, stream>>>(a, means2D, depths, conics, radii);
  check(cudaGetLastError(), "project");
}

void rasterize_backward(const RasterArgs& a, int num_rendered, char* geometry_buffer,
                        char* binning_buffer, char* image_buffer, const float* dL_dout_color,
                        float* dL_dcolor, cudaStream_t stream) {
  const dim3 tile_grid((a.width + kTile - 1) / kTile, (a.height + kTile - 1) / kTile);
  const int tiles = static_cast<int>(tile_grid.x * tile_grid.y);
  GeometryState g = GeometryState::fromChunk(geometry_buffer, a.P);
  BinningState b = BinningState::fromChunk(binning_buffer, num_rendered);
  ImageState img = ImageState::fromChunk(image_buffer, static_cast<size_t>(a.width) * a.height,
                                         tiles);
  // A staging buffer from cudaMalloc (not the caching allocator), as some extensions do.
  const size_t bytes = std::max(kStagingBytes, static_cast<size_t>(a.P) * 3 * sizeof(float));
  float* staging = nullptr;
  check(cudaMalloc(&staging, bytes), "staging");
  backward_kernel<<<blocks(a.P, 128), 128, 0, stream>>>(a, tile_grid.x, img.ranges, b.values,
                                                        g, dL_dout_color, staging);
  check(cudaGetLastError(), "backward");
  check(cudaMemcpyAsync(dL_dcolor, staging, static_cast<size_t>(a.P) * 3 * sizeof(float),
                        cudaMemcpyDeviceToDevice, stream), "dL_dcolor");
  check(cudaStreamSynchronize(stream), "backward");
#ifndef GPUCHECK_ZOO_LEAK
  check(cudaFree(staging), "staging");
#endif  // Defect (GPUCHECK_ZOO_LEAK): 16 MiB outside PyTorch's allocator lost per call
}

}  // namespace TORCH_EXTENSION_NAME
