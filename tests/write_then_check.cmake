# Runs a C++ program that writes files into DIR (WRITER, with WRITER_ARGS before DIR), then a
# Python script that checks them (CHECK DIR); fails if either does.
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
separate_arguments(writer_args UNIX_COMMAND "${WRITER_ARGS}")
execute_process(COMMAND ${WRITER} ${writer_args} ${DIR} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "${WRITER} failed: ${rc}")
endif()
execute_process(COMMAND ${PYTHON} ${CHECK} ${DIR} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "${CHECK} failed: ${rc}")
endif()
