"""Fused SSIM, the 3DGS training loss: its wrapper (``op``), its oracle (``reference``) and its
planted defects (``defects``); CUDA sources in csrc/ssim/, GPU suite in suites/ssim/."""
