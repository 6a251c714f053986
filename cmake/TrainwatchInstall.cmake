# What `cmake --install` puts where, and the exported CMake package a C++
# trainer finds with
#
#   find_package(trainwatch 0.1 REQUIRED)
#   target_link_libraries(my_trainer PRIVATE trainwatch::agent trainwatch::kernels)
#
# Components: `dev` (headers, static libraries, the CMake package), `server`
# (trainwatchd and twctl). `service` holds the files only a system package
# ships (systemd unit, /etc/trainwatch, Debian docs); it is outside the
# default install, so `cmake --install --prefix P` never writes to /etc or
# /lib, and cpack asks for it by name (cmake/TrainwatchPackage.cmake).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TRAINWATCH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/trainwatch)

# The libraries a trainer links, and trainwatch_proto and trainwatch_wire,
# which the agent links privately: static archives carry their private
# dependencies to the consumer's link line, so they have to be in the export
# too (their headers do not: a trainer never includes them).
set_target_properties(trainwatch_core PROPERTIES EXPORT_NAME core)
set_target_properties(trainwatch_kernels PROPERTIES EXPORT_NAME kernels)
set_target_properties(trainwatch_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(trainwatch_wire PROPERTIES EXPORT_NAME wire)
set_target_properties(trainwatch_agent PROPERTIES EXPORT_NAME agent)
install(TARGETS trainwatch_core trainwatch_kernels trainwatch_proto trainwatch_wire
                trainwatch_agent
  EXPORT trainwatchTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(_dir core/include/trainwatch agent/include/trainwatch kernels/include/trainwatch)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/trainwatch
          COMPONENT dev FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/core/include/trainwatch/core/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/trainwatch/core COMPONENT dev)
install(EXPORT trainwatchTargets NAMESPACE trainwatch:: DESTINATION ${TRAINWATCH_CMAKE_DIR}
        COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/trainwatchConfig.cmake.in
  ${PROJECT_BINARY_DIR}/trainwatchConfig.cmake INSTALL_DESTINATION ${TRAINWATCH_CMAKE_DIR})
# 0.x releases break freely, so 0.1 accepts 0.1.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/trainwatchConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/trainwatchConfig.cmake
              ${PROJECT_BINARY_DIR}/trainwatchConfigVersion.cmake
        DESTINATION ${TRAINWATCH_CMAKE_DIR} COMPONENT dev)

if(TARGET trainwatchd)
  install(TARGETS trainwatchd twctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT server)
endif()
