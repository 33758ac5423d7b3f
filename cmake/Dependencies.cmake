# Every dependency, why it is here, and a one-line report of what was found.
find_package(PkgConfig REQUIRED)
find_package(OpenMP REQUIRED)                       # CPU op parallelism
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)                         # cblas_sgemm/dgemm for every CPU GEMM
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas REQUIRED)
find_package(nlohmann_json REQUIRED)                # checkpoint metadata, JSONL, configs
find_package(fmt REQUIRED)                          # formatting of messages and log lines
find_package(spdlog REQUIRED)                       # rank-aware logging
find_package(Threads REQUIRED)
find_package(zstd CONFIG QUIET)                     # .zst JSONL input (data pipeline)
pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)  # checkpoint checksums
pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)  # GPT-2 pre-tokeniser regex
pkg_check_modules(SENTENCEPIECE QUIET IMPORTED_TARGET sentencepiece)
pkg_check_modules(UTF8PROC QUIET IMPORTED_TARGET libutf8proc)  # NFC/NFKC normalizers (tokenizer.json)
find_package(simdjson QUIET)                        # fast JSONL parsing in preprocess
find_package(GTest REQUIRED)
find_package(benchmark QUIET)
find_package(MPI COMPONENTS CXX QUIET)              # multi-process CPU runs

set(MCPP_DEPS OpenMP::OpenMP_CXX ${BLAS_LIBRARIES} nlohmann_json::nlohmann_json
    fmt::fmt spdlog::spdlog Threads::Threads)
set(MCPP_DEFS SPDLOG_FMT_EXTERNAL)
include_directories(SYSTEM ${CBLAS_INCLUDE_DIR})

macro(mcpp_optional found target def what)
  if(${found})
    list(APPEND MCPP_DEPS ${target})
    list(APPEND MCPP_DEFS ${def})
    message(STATUS "megatron.cpp: ${what}: yes")
  else()
    message(STATUS "megatron.cpp: ${what}: NO")
  endif()
endmacro()
mcpp_optional(zstd_FOUND zstd::libzstd_shared MCPP_HAVE_ZSTD "zstd (.zst input)")
mcpp_optional(XXHASH_FOUND PkgConfig::XXHASH MCPP_HAVE_XXHASH "xxHash (checksums)")
mcpp_optional(PCRE2_FOUND PkgConfig::PCRE2 MCPP_HAVE_PCRE2 "PCRE2 (GPT-2 BPE)")
mcpp_optional(SENTENCEPIECE_FOUND PkgConfig::SENTENCEPIECE MCPP_HAVE_SENTENCEPIECE "sentencepiece")
mcpp_optional(UTF8PROC_FOUND PkgConfig::UTF8PROC MCPP_HAVE_UTF8PROC
              "utf8proc (NFC/NFD/NFKC/NFKD normalizers of tokenizer.json)")
mcpp_optional(simdjson_FOUND simdjson::simdjson MCPP_HAVE_SIMDJSON "simdjson")
mcpp_optional(MPI_CXX_FOUND MPI::MPI_CXX MCPP_HAVE_MPI "MPI")
find_package(ZLIB QUIET)
mcpp_optional(ZLIB_FOUND ZLIB::ZLIB MCPP_HAVE_ZLIB "zlib (.gz input)")
if(benchmark_FOUND)
  message(STATUS "megatron.cpp: Google Benchmark: yes")
endif()

# ---- CUDA: optional, compiled whenever nvcc is present ----------------------------
set(MCPP_HAVE_CUDA OFF)
if(MCPP_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # sm_90a SASS (Hopper: H100/H200; wgmma/TMA available to kernels) + PTX for later
      # GPUs. No separate sm_90 SASS: an sm_90a cubin runs on every compute capability 9.0
      # device, and a second copy of every kernel cost a third of the CUDA compile time.
      set(CMAKE_CUDA_ARCHITECTURES 90a-real 90-virtual)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc 13's C++20 flags; tell it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(MCPP_HAVE_CUDA ON)
    # fmt 9 switches its constexpr support off under nvcc, which then breaks on C++20's
    # consteval format strings; the host compiler behind nvcc handles it, so turn it on.
    add_compile_options($<$<COMPILE_LANGUAGE:CUDA>:-DFMT_USE_CONSTEXPR=1>
                        $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>
                        $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
    # cuBLAS(Lt) is not linked: src/ops/cuda/cublaslt_loader.cpp opens it on the first GEMM
    # (loading it costs every process ~0.35 s, CPU runs included). Its headers come with
    # cudart's include folder; the loader is told the soname and the configured path.
    set(MCPP_CUDA_DEPS CUDA::cudart ${CMAKE_DL_LIBS})
    set(MCPP_CUBLASLT_DEFS
        MCPP_CUBLASLT_SONAME="libcublasLt.so.${CUDAToolkit_VERSION_MAJOR}"
        MCPP_CUBLASLT_PATH="${CUDAToolkit_LIBRARY_DIR}/libcublasLt.so.${CUDAToolkit_VERSION_MAJOR}"
        MCPP_CUDA_MAJOR="${CUDAToolkit_VERSION_MAJOR}")
    # cuDNN and NCCL: the CUDA toolkit folder on CI, a Python wheel's folder on the GPU machine
    # (pass -DMCPP_CUDNN_ROOT=... -DMCPP_NCCL_ROOT=...; scripts/gpu-check.sh does).
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${MCPP_CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
    # PyTorch's wheels ship only the versioned names (libcudnn.so.9, libnccl.so.2).
    find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${MCPP_CUDNN_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${MCPP_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${MCPP_NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
    message(STATUS "megatron.cpp: CUDA: yes (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
    if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
      message(STATUS "megatron.cpp: cuDNN: yes (${CUDNN_LIBRARY}; fused attention)")
      # Its runtime-compiled attention engines need NVRTC and the driver API.
      list(APPEND MCPP_CUDA_DEPS ${CUDNN_LIBRARY} CUDA::nvrtc CUDA::cuda_driver)
      include_directories(SYSTEM ${CUDNN_INCLUDE_DIR})
      add_compile_definitions(MCPP_HAVE_CUDNN)
    else()
      message(STATUS "megatron.cpp: cuDNN: NO (attention uses the own flash kernel)")
    endif()
    set(MCPP_HAVE_NCCL OFF)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(MCPP_HAVE_NCCL ON)
      message(STATUS "megatron.cpp: NCCL: yes (${NCCL_LIBRARY}; multi-GPU runs use src/comm/nccl)")
    else()
      message(STATUS "megatron.cpp: NCCL: NO (multi-GPU runs need NCCL: pass -DMCPP_NCCL_ROOT=...)")
    endif()
  else()
    message(STATUS "megatron.cpp: CUDA: NO (nvcc not found; CPU build only)")
  endif()
else()
  message(STATUS "megatron.cpp: CUDA: NO (MCPP_ENABLE_CUDA=OFF)")
endif()
