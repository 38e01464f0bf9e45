/// @file
/// Every CUDA, cuBLAS(Lt) and cuDNN call is checked; a failure throws precis::cuda_error naming the
/// call, the library's status string and where it was made. Available when CUDA's headers are
/// (PRECIS_CUDA=1 or nvcc).
#pragma once

#include <precis/config.hpp>

#include <string>
#include <string_view>

#if PRECIS_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

namespace precis {

/// Where a call was made. std::source_location needs a builtin clang 14 lacks;
/// __builtin_FILE/__builtin_LINE work in g++, clang++ and nvcc.
struct source_location {
  const char* file;  ///< Source file name, as the compiler spells it.
  unsigned line;     ///< Line number in that file.
  /// The location of the caller when used as a default argument (as precis::check does).
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           unsigned line = __builtin_LINE()) {
    return {file, line};
  }
  /// The source file name (as `std::source_location::file_name`).
  constexpr const char* file_name() const { return file; }
  /// The line number (as `std::source_location::line`).
  constexpr unsigned line_number() const { return line; }
};

/// A failed CUDA, cuBLAS or cuDNN call: what() holds the call, its status and the source
/// location; status() the numeric status.
class cuda_error : public error {
 public:
  /// Builds what() as `CALL failed: STATUS_TEXT (status STATUS) at FILE:LINE`.
  /// @param call         the call that failed, as written at the call site
  /// @param status       the library's numeric status code
  /// @param status_text  the library's string for that status
  /// @param where        where the call was made
  cuda_error(std::string_view call, int status, std::string_view status_text,
             const source_location& where)
      : error(std::string(call) + " failed: " + std::string(status_text) + " (status " +
              std::to_string(status) + ") at " + where.file_name() + ":" +
              std::to_string(where.line_number())),
        status_(status) {}
  /// The numeric status the failed call returned (a `cudaError_t`, `cublasStatus_t` or
  /// `cudnnStatus_t` value).
  int status() const { return status_; }

 private:
  int status_;
};

#if PRECIS_CUDA

/// Checks a CUDA runtime status: `check(cudaMalloc(&p, n), "cudaMalloc")`.
inline void check(cudaError_t status, std::string_view call,
                  const source_location& where = source_location::current()) {
  if (status != cudaSuccess) {
    throw cuda_error(call, static_cast<int>(status), cudaGetErrorString(status), where);
  }
}

/// Checks a cuBLAS / cuBLASLt status.
inline void check(cublasStatus_t status, std::string_view call,
                  const source_location& where = source_location::current()) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw cuda_error(call, static_cast<int>(status), cublasLtGetStatusString(status), where);
  }
}

/// Checks a cuDNN status.
inline void check(cudnnStatus_t status, std::string_view call,
                  const source_location& where = source_location::current()) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw cuda_error(call, static_cast<int>(status), cudnnGetErrorString(status), where);
  }
}

#endif

}  // namespace precis
