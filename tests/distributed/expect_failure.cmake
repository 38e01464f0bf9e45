# Runs COMMAND (a ;-list) with a time limit of LIMIT seconds and requires it to fail:
# a nonzero exit before the limit. Success, or running past the limit (a hang), fails.
cmake_minimum_required(VERSION 3.20)
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${LIMIT})
message(STATUS "exit: ${rc}\n${out}${err}")
if(rc MATCHES "timeout")
  message(FATAL_ERROR "still running after ${LIMIT} s: the run hangs instead of failing")
elseif(rc EQUAL 0)
  message(FATAL_ERROR "the run succeeded although a rank died")
endif()
