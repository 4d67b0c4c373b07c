"""The tile-based 3D Gaussian splatting rasterizer: its wrapper (``op``), its oracle
(``reference``, with its spherical harmonics in ``reference_sh``) and its planted defects
(``defects``); CUDA sources in csrc/splat/, GPU suite in suites/splat/."""
