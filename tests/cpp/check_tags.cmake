# Fails when some test case matches SPEC: one that carries none of the area tags, or a
# [gpu] one outside the GPU areas (see CMakeLists.txt); ctest would never run it.
# Lists the test cases matching SPEC, names only: Catch2 3 spells it
# "--list-tests --verbosity quiet", Catch2 2 "--list-test-names-only".
if(CATCH_MAJOR GREATER_EQUAL 3)
  set(list_args --list-tests --verbosity quiet)
else()
  set(list_args --list-test-names-only)
endif()
execute_process(COMMAND ${EXE} ${SPEC} ${list_args} OUTPUT_VARIABLE out)
string(STRIP "${out}" out)
if(NOT out STREQUAL "")
  message(FATAL_ERROR "test cases matching ${SPEC} (ctest would not run them):\n${out}")
endif()
message(STATUS "no test case matches ${SPEC}")
