# Read by CTest after integration_test's cases are discovered (a
# TEST_INCLUDE_FILES of this folder, since a discovered case does not exist
# at configure time): the COST of its one long case, so that on a fresh
# clone (no timing history yet) it starts among the first tests rather than
# last (see tests/CMakeLists.txt). CTest ignores a name it does not know: a
# renamed case only loses its early start, so rename it here too.
set_tests_properties("e2e: the example trainer through tiers 1 and 2 and 3 with real components"
  PROPERTIES COST 110)
set_tests_properties("follow e2e: the detached trainer's log piped to twctl follow pages as observed"
  PROPERTIES COST 30)
