# trainwatch::catch_main: Catch2 (v2, header-only) and its main(), built once
# and linked by every Catch2 test binary instead of each binary compiling the
# runner in one of its own files (CATCH_CONFIG_MAIN): that one file cost
# about 48 CPU-seconds per binary at -O2 -g, a dozen binaries in all.
#
# Included from tests/ and from tests/kernels/ (which kernels/ also adds when
# it is built on its own), hence the guard. Needs the Catch2::Catch2 target.
include_guard(GLOBAL)
add_library(trainwatch_catch_main STATIC
            ${CMAKE_CURRENT_LIST_DIR}/../tests/testing/catch_main.cc)
add_library(trainwatch::catch_main ALIAS trainwatch_catch_main)
target_link_libraries(trainwatch_catch_main PUBLIC Catch2::Catch2)
