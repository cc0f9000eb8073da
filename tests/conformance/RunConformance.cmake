# Finds the node-test directories (Debian's and the onnx wheel's) and runs the
# conformance runner over both; the wheel's newer data wins for shared names.
set(dirs "")
if(EXISTS "${DEBIAN_DATA}")
  list(APPEND dirs "${DEBIAN_DATA}")
endif()
execute_process(COMMAND "${PYTHON}" -c
  "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data', 'node'))"
  OUTPUT_VARIABLE wheel_data OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
if(rc EQUAL 0 AND EXISTS "${wheel_data}")
  list(APPEND dirs "${wheel_data}")
endif()
if(NOT dirs)
  message(FATAL_ERROR "no ONNX node test data found (install libonnx-testdata or onnx in the venv)")
endif()
message(STATUS "conformance data: ${dirs}")
execute_process(COMMAND "${RUNNER}" ${dirs} ${EXTRA_ARGS} RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "conformance below the required pass rate")
endif()
