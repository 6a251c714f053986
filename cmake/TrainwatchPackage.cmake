# The Debian package of trainwatchd and twctl (`make package`, which runs
# cpack in the build folder): the binaries in /usr/bin with their manual
# pages, the systemd unit, a
# trainwatch system user made by postinst, /var/lib/trainwatch for the
# database, and /etc/trainwatch with the flags, tokens, rules and pager files
# as conffiles. Dependencies come from the shared libraries the binaries link
# (dpkg-shlibdeps), plus adduser for postinst.
set(_deploy ${PROJECT_SOURCE_DIR}/deploy)
set(_debian ${PROJECT_BINARY_DIR}/debian)

# The default rules, printed by the twctl that is being packaged, so the
# conffile always matches the engine's defaults of this release.
add_custom_command(OUTPUT ${_debian}/rules.json
  COMMAND $<TARGET_FILE:twctl> replay --print-config > ${_debian}/rules.json
  DEPENDS twctl VERBATIM)
configure_file(${_deploy}/debian/changelog.in ${_debian}/changelog @ONLY)
# Debian wants the changelog compressed with no timestamp in it (gzip -n).
add_custom_command(OUTPUT ${_debian}/changelog.gz
  COMMAND gzip -9nc ${_debian}/changelog > ${_debian}/changelog.gz
  DEPENDS ${_debian}/changelog VERBATIM)
# Manual pages, compressed the same way.
foreach(_page trainwatchd.8 twctl.1)
  add_custom_command(OUTPUT ${_debian}/${_page}.gz
    COMMAND gzip -9nc ${_deploy}/debian/${_page} > ${_debian}/${_page}.gz
    DEPENDS ${_deploy}/debian/${_page} VERBATIM)
endforeach()
add_custom_target(trainwatch_package_files ALL
  DEPENDS ${_debian}/rules.json ${_debian}/changelog.gz ${_debian}/trainwatchd.8.gz
          ${_debian}/twctl.1.gz)

# trainwatch-follow@RUN.service: twctl follow for one job, its settings in
# /etc/trainwatch/follow/RUN.env (the example is in the package's docs).
install(FILES ${_deploy}/systemd/trainwatchd.service ${_deploy}/systemd/trainwatch-follow@.service
        DESTINATION /lib/systemd/system
        COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${_deploy}/systemd/trainwatchd.flags ${_deploy}/systemd/tokens.json
              ${_deploy}/systemd/pager.json ${_debian}/rules.json
        DESTINATION /etc/trainwatch COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${_deploy}/debian/copyright ${_debian}/changelog.gz ${PROJECT_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/trainwatchd COMPONENT service EXCLUDE_FROM_ALL)
# The README is an overview whose links lead to docs/: the pages go beside it.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/trainwatchd/docs COMPONENT service
        EXCLUDE_FROM_ALL FILES_MATCHING PATTERN "*.md")
install(FILES ${_deploy}/systemd/follow-example.env
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/trainwatchd/examples COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${_debian}/trainwatchd.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8
        COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${_debian}/twctl.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
        COMPONENT service EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME trainwatchd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "trainwatch developers <trainwatch@packages.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "training-health server for large-model pre-training")
# The synopsis is the summary above; this is the extended description.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "trainwatchd receives per-step health records (loss, gradient norm, log Z,
loss EMA ratio, nonfinite fraction) from agents inside a trainer, runs the
tiered rule engine on them, keeps every record and decision in SQLite,
pages a human for logit drift and coordinates the approved rollback.
twctl is the operator's command line for it.")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS adduser)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${_deploy}/debian/conffiles ${_deploy}/debian/postinst ${_deploy}/debian/prerm
    ${_deploy}/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# One package of the server and the service files; the headers and static
# libraries (component dev) are for `cmake --install`, not for this package.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL server service)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_DEBIAN_PACKAGE_NAME trainwatchd)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/package)
include(CPack)
