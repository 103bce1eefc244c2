# packaging.cmake — the relay as a service and the Debian package (included by CMakeLists.txt).
#   install: obx-relay.service (systemd unit) and the example /etc/obx/relay.yaml;
#   `cpack -G DEB` (scripts/package.sh): one package "obx" with the CLI, libobx (shared and
#   static), obx.h, obx.pc, the CMake package, the man page, the bash, zsh and fish completions,
#   the unit and the example configuration (a conffile); maintainer scripts in packaging/debian/.
# Paths follow CMAKE_INSTALL_PREFIX; the package is built with -DCMAKE_INSTALL_PREFIX=/usr
# (then /etc and /lib/systemd/system are Debian's own places).
set(OBX_ETC ${CMAKE_INSTALL_FULL_SYSCONFDIR}/obx)
set(OBX_UNIT_DIR lib/systemd/system CACHE STRING "systemd unit folder, under the prefix")
configure_file(packaging/obx-relay.service.in ${CMAKE_CURRENT_BINARY_DIR}/obx-relay.service @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/obx-relay.service DESTINATION ${OBX_UNIT_DIR})
install(FILES packaging/relay.yaml DESTINATION ${OBX_ETC})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME obx)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "obx")
set(CPACK_PACKAGE_CONTACT "obx maintainers <obx@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "transactional outbox with delivery reconciliation")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "obx moves events committed in a database (SQLite or PostgreSQL) to Kafka or RabbitMQ and\n"
  "proves, per event, whether the broker has it. This package holds the obx command, the\n"
  "relay service obx-relay.service with an example /etc/obx/relay.yaml, and libobx (shared and\n"
  "static library, obx.h, pkg-config and CMake files).")
# the shared libraries it links (libsqlite3, libpq, librdkafka, ...) from dpkg-shlibdeps;
# passwd for useradd in postinst
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd")
if(OBX_WITH_OTEL)
  # libcurl4 (OpenSSL flavour) for the OpenTelemetry exporter, named as well as found by shlibdeps
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libcurl4")
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian/conffiles
    ${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian/postinst
    ${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian/prerm
    ${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
include(CPack)
