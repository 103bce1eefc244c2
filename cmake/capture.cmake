# cmake -DOUT=FILE -DPROG=PROGRAM -DARGS="ARG ARG..." -P capture.cmake — runs PROGRAM ARGS and
# writes its standard output to FILE (build-time generation without a shell's redirection);
# fails when the program fails.
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${PROG} ${args} OUTPUT_FILE ${OUT}.tmp RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROG} ${ARGS}: exit status ${rc}")
endif()
file(RENAME ${OUT}.tmp ${OUT})
