# Include from every directory that builds MLIR-using code (compiler/, passes/,
# tools/forgec, tools/forge-opt, MLIR-using tests). HandleLLVMOptions changes
# directory-wide flags, so it must never reach runtime/ (DESIGN.md §11).
set(MLIR_DIR "/usr/lib/llvm-19/lib/cmake/mlir" CACHE PATH "MLIR CMake config directory")
find_package(MLIR REQUIRED CONFIG)
find_package(ONNX REQUIRED CONFIG)

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
# LLVM 19's tablegen depfiles get a doubled path under NEW (DESIGN.md §11).
cmake_policy(SET CMP0116 OLD)
include(TableGen)
include(AddLLVM)
include(AddMLIR)
include(HandleLLVMOptions)

include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
separate_arguments(FORGE_LLVM_DEFINITIONS NATIVE_COMMAND ${LLVM_DEFINITIONS})
add_definitions(${FORGE_LLVM_DEFINITIONS})
include_directories(${PROJECT_SOURCE_DIR}/compiler/include ${PROJECT_BINARY_DIR}/compiler/include)

# UBSan builds (the asan preset): LLVM's and MLIR's shared libraries have no RTTI, so
# UBSan's vptr check reports every virtual call on one of their objects made from our
# code (llvm::cl::Option in the tools' option set-up) as an invalid vptr. The tools'
# main files call into the command-line library: the check is off there, and on
# everywhere else.
function(forge_no_vptr_check target)
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*undefined")
    target_compile_options(${target} PRIVATE -fno-sanitize=vptr)
  endif()
endfunction()
