# Installs the maskattn build at MASKATTN_BUILD_DIR into a scratch prefix, then configures, builds
# and runs the consumer project against it with find_package(maskattn).
function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${step} failed (${result}):\n${output}")
  endif()
  set(last_output "${output}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${SCRATCH_DIR}")
run(install ${CMAKE_COMMAND} --install "${MASKATTN_BUILD_DIR}" --prefix "${SCRATCH_DIR}/prefix")
run(configure ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${SCRATCH_DIR}/build"
    "-DCMAKE_PREFIX_PATH=${SCRATCH_DIR}/prefix" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
run(build ${CMAKE_COMMAND} --build "${SCRATCH_DIR}/build")
run(run "${SCRATCH_DIR}/build/consumer")
message(STATUS "${last_output}")
if(NOT last_output MATCHES "worked example OK")
  message(FATAL_ERROR "consumer printed: ${last_output}")
endif()
run(run_parts "${SCRATCH_DIR}/build/consumer_parts")
message(STATUS "${last_output}")
if(NOT last_output MATCHES "components OK")
  message(FATAL_ERROR "consumer_parts printed: ${last_output}")
endif()
