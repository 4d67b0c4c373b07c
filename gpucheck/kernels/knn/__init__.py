"""Exact k-nearest-neighbour mean squared distance (simple-knn's ``distCUDA2``): its wrapper
(``op``), its oracle (``reference``) and its planted defects (``defects``); CUDA sources in
csrc/knn/, GPU suite in suites/knn/."""
