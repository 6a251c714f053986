# Catch2's main(), compiled once (trainwatch_catch_main) and made part of
# Catch2::Catch2 (v2, header-only), so that every test binary that links
# Catch2::Catch2 gets it, instead of each binary compiling the runner in one
# of its own files (CATCH_CONFIG_MAIN): that one file cost about 45
# CPU-seconds per binary at -O2 -g, for a dozen binaries.
# tests/check_catch_main.sh fails if a test file defines its own again.
#
# Included from tests/ and from tests/kernels/ (which kernels/ also adds when
# it is built on its own), hence the guard. Needs the Catch2::Catch2 target.
include_guard(GLOBAL)
add_library(trainwatch_catch_main STATIC
            ${CMAKE_CURRENT_LIST_DIR}/../tests/testing/catch_main.cc)
# Catch2's headers without linking Catch2::Catch2, which links this.
target_include_directories(trainwatch_catch_main PRIVATE
  $<TARGET_PROPERTY:Catch2::Catch2,INTERFACE_INCLUDE_DIRECTORIES>)
set_property(TARGET Catch2::Catch2 APPEND PROPERTY INTERFACE_LINK_LIBRARIES trainwatch_catch_main)
