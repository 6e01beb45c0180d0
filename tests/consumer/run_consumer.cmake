# cmake -P script run by the consumer ctest (see consumer_test.cmake).
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
run("install into ${prefix}" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run("the installed command" ${prefix}/bin/flashattn info)

# find_package(flashattn): the exported targets, shared and static.
run("configure the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
run("build the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("run the consumer (shared)" ${WORK_DIR}/build/consumer_shared)
run("run the consumer (static)" ${WORK_DIR}/build/consumer_static)

# pkg-config: a C program compiled with the installed flashattn.pc.
if(NOT PKG_CONFIG OR NOT C_COMPILER)
  message(FATAL_ERROR "pkg-config and a C compiler are needed for the pkg-config half of this test")
endif()
set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs flashattn RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs flashattn failed: ${err}")
endif()
message(STATUS "pkg-config flags: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
run("compile the C consumer" ${C_COMPILER} -std=c99 -Wall -Werror ${CONSUMER_DIR}/consumer_c.c ${flags} -lm
    -o ${WORK_DIR}/consumer_c)
set(ENV{LD_LIBRARY_PATH} ${prefix}/${LIBDIR})
run("run the C consumer" ${WORK_DIR}/consumer_c)
