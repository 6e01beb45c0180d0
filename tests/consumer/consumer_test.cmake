# Included by tests/CMakeLists.txt. One ctest installs this build into a fresh prefix and builds
# and runs tests/consumer against it: find_package(flashattn) with the shared and the static
# target, and a C program compiled with pkg-config.
find_program(FLASHATTN_PKG_CONFIG pkg-config)
find_program(FLASHATTN_C_COMPILER NAMES cc gcc clang)
add_test(NAME consumer.install_find_package_pkg_config
  COMMAND ${CMAKE_COMMAND}
    -DBUILD_DIR=${PROJECT_BINARY_DIR}
    -DCONSUMER_DIR=${CMAKE_CURRENT_LIST_DIR}
    -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer
    -DLIBDIR=${CMAKE_INSTALL_LIBDIR}
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DC_COMPILER=${FLASHATTN_C_COMPILER}
    -DPKG_CONFIG=${FLASHATTN_PKG_CONFIG}
    -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
set_tests_properties(consumer.install_find_package_pkg_config PROPERTIES LABELS cpu TIMEOUT 900)
