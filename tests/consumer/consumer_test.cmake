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

# The `flashattn` command from the build tree: a small demo whose two errors against the fp64
# reference (FlashAttention and standard attention) must both be small, every op of a bench sweep
# with --verify and --json, and a bad option (a one-line message naming it).
if(TARGET flashattn_cli)
  add_test(NAME cli.demo COMMAND flashattn_cli demo --n 200 --h 3 --d 32 --runs 1)
  set_tests_properties(cli.demo PROPERTIES LABELS cpu
    PASS_REGULAR_EXPRESSION "max \\|error\\| vs fp64 reference +[0-9.]+e-0[5-9] +[0-9.]+e-0[5-9]")
  add_test(NAME cli.bench_verify COMMAND flashattn_cli bench --op fwd,bwd,decode --n 77 --h 4 --h-kv 2 --d 32
           --causal 0,1 --dtype f32,bf16 --runs 2 --warmup 1 --verify --json ${CMAKE_CURRENT_BINARY_DIR}/cli_bench.json)
  set_tests_properties(cli.bench_verify PROPERTIES LABELS cpu FAIL_REGULAR_EXPRESSION " nan | inf |error:")
  add_test(NAME cli.bad_option COMMAND flashattn_cli bench --n 0)
  set_tests_properties(cli.bad_option PROPERTIES LABELS cpu WILL_FAIL TRUE)
  add_test(NAME cli.bad_option_message COMMAND flashattn_cli bench --n 0)
  set_tests_properties(cli.bad_option_message PROPERTIES LABELS cpu PASS_REGULAR_EXPRESSION "^flashattn bench: option '--n' value 0 is outside")
endif()
