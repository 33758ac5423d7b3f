# cmake -DCMD=<list> -DEXPECT=<regex> -DMAX_SECONDS=<n> [-DANY_STATUS=1] -P check_abort.cmake
# Passes when CMD exits non-zero, its output matches EXPECT, and it took at most
# MAX_SECONDS (a hang would be killed at twice that and fail). ANY_STATUS: the launcher's
# exit status is not checked (mpirun with orte_enable_recovery exits 0 after a rank's
# MPI_Abort, and does not always print its abort notice); the message and the time bound
# still prove that the job ended by the timeout, not by a hang.
math(EXPR kill_after "${MAX_SECONDS} * 2")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT ${kill_after})
string(TIMESTAMP t1 "%s")
math(EXPR secs "${t1} - ${t0}")
message("${out}")
message("exit status: ${rc}, ${secs} s")
if(rc STREQUAL "0" AND NOT ANY_STATUS)
  message(FATAL_ERROR "expected a non-zero exit status")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "expected the output to match: ${EXPECT}")
endif()
if(secs GREATER MAX_SECONDS)
  message(FATAL_ERROR "took ${secs} s, more than ${MAX_SECONDS} s")
endif()
