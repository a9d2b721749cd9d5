# SPDX-License-Identifier: MIT
# Run by CTest (see CMakeLists.txt here):
#   cmake -DMODE=find_package|pkg_config -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=...
#         -DLIBDIR=lib -DC_COMPILER=cc [-DSAN_FLAGS=...] [-DCONFIG=...] -P install_test.cmake
# Fails (FATAL_ERROR) with the failing step's output.
cmake_minimum_required(VERSION 3.20)

foreach(v MODE BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR C_COMPILER)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: -D${v}= is required")
  endif()
endforeach()

set(PREFIX "${WORK_DIR}/prefix")
if(IS_ABSOLUTE "${LIBDIR}")
  message(FATAL_ERROR "install_test: an absolute CMAKE_INSTALL_LIBDIR (${LIBDIR}) cannot be "
                      "installed into a private prefix")
endif()
set(LIB "${PREFIX}/${LIBDIR}")
separate_arguments(SAN UNIX_COMMAND "${SAN_FLAGS}")

# run(<step> COMMAND ...): execute, fail with its output unless it exits 0;
# its stdout is left in RUN_OUT.
function(run step)
  execute_process(${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_test(${MODE}): ${step} failed (${rc})\n${out}\n${err}")
  endif()
  string(STRIP "${out}" out)
  set(RUN_OUT "${out}" PARENT_SCOPE)
endfunction()

# 1. Install into a fresh private prefix.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(_cfg "")
if(CONFIG)
  set(_cfg --config "${CONFIG}")
endif()
run("cmake --install" COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}" ${_cfg})

# What was installed: the public headers, both libraries, the package files;
# no internals.
foreach(f include/hetmem/hetmem.h include/hetmem/base.h include/hetmem/pools/proxy.h
          include/hetmem/providers/os.h ${LIBDIR}/libhetmem.so ${LIBDIR}/libhetmem.a
          ${LIBDIR}/pkgconfig/hetmem.pc ${LIBDIR}/cmake/hetmem/hetmemConfig.cmake
          ${LIBDIR}/cmake/hetmem/hetmemConfigVersion.cmake)
  if(NOT EXISTS "${PREFIX}/${f}")
    message(FATAL_ERROR "install_test: ${f} was not installed")
  endif()
endforeach()
file(GLOB_RECURSE _headers RELATIVE "${PREFIX}/include" "${PREFIX}/include/*")
foreach(h ${_headers})
  if(NOT h MATCHES "^hetmem/")
    message(FATAL_ERROR "install_test: unexpected installed header ${h}")
  endif()
  if(NOT EXISTS "${SOURCE_DIR}/include/${h}")
    message(FATAL_ERROR "install_test: installed header ${h} is not a public header")
  endif()
endforeach()

# Runs one built example; it must print its success line and exit 0.
function(run_example exe)
  run("running ${exe}" COMMAND "${exe}")
  if(NOT RUN_OUT MATCHES "all [0-9]+ checks passed")
    message(FATAL_ERROR "install_test: ${exe} did not report success:\n${RUN_OUT}")
  endif()
  get_filename_component(n "${exe}" NAME)
  message(STATUS "${n}: ok")
endfunction()

if(MODE STREQUAL "find_package")
  # 2a. A separate CMake project: examples/ built standalone.
  set(_b "${WORK_DIR}/examples")
  string(JOIN " " _san_str ${SAN})
  run("configuring examples/ with find_package(hetmem)"
      COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/examples" -B "${_b}"
              -DCMAKE_BUILD_TYPE=Release
              "-DCMAKE_C_COMPILER=${C_COMPILER}"
              "-DCMAKE_C_FLAGS=${_san_str}" "-DCMAKE_EXE_LINKER_FLAGS=${_san_str}"
              "-Dhetmem_DIR=${LIB}/cmake/hetmem"
              -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
  run("building examples/" COMMAND "${CMAKE_COMMAND}" --build "${_b}" -j 2)
  if(NOT EXISTS "${_b}/basic_static")
    message(FATAL_ERROR "install_test: hetmem::hetmem_static was not found by find_package")
  endif()
  run_example("${_b}/basic")
  run_example("${_b}/basic_static")

elseif(MODE STREQUAL "pkg_config")
  # 2b. The compiler driven by pkg-config alone.
  find_program(PKG_CONFIG NAMES pkg-config pkgconf)
  if(NOT PKG_CONFIG)
    message(FATAL_ERROR "install_test: pkg-config is not installed")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${LIB}/pkgconfig")
  run("pkg-config --cflags --libs hetmem" COMMAND "${PKG_CONFIG}" --cflags --libs hetmem)
  separate_arguments(_flags UNIX_COMMAND "${RUN_OUT}")
  # The relocatable .pc must lead to this prefix's library directory.
  set(_found_lib FALSE)
  get_filename_component(_want "${LIB}" REALPATH)
  foreach(f ${_flags})
    if(f MATCHES "^-L(.+)$")
      get_filename_component(_dir "${CMAKE_MATCH_1}" REALPATH)
      if(_dir STREQUAL _want)
        set(_found_lib TRUE)
      endif()
    endif()
  endforeach()
  if(NOT _found_lib)
    message(FATAL_ERROR "install_test: hetmem.pc points elsewhere than ${LIB}: ${RUN_OUT}")
  endif()
  run("compiling basic.c (shared)"
      COMMAND "${C_COMPILER}" -std=gnu11 ${SAN} "${SOURCE_DIR}/examples/basic.c" ${_flags}
              -Xlinker -rpath -Xlinker "${LIB}" -o "${WORK_DIR}/basic")
  run_example("${WORK_DIR}/basic")

  # Static: libhetmem.a plus the packages hetmem.pc says it needs privately
  # (Requires.private), linked the usual Debian way: those shared. (A fully
  # static `pkg-config --static` link would also need hwloc's own private
  # dependencies, e.g. libudev, which are not hetmem's business.)
  run("pkg-config --print-requires-private hetmem"
      COMMAND "${PKG_CONFIG}" --print-requires-private hetmem)
  string(REGEX REPLACE "[ \t\r\n]+" ";" _private "${RUN_OUT}")
  foreach(m hwloc liburcu-bp liburcu-cds)
    if(NOT m IN_LIST _private)
      message(FATAL_ERROR "install_test: hetmem.pc lacks ${m} in Requires.private (${RUN_OUT})")
    endif()
  endforeach()
  run("pkg-config --cflags --libs hetmem ${_private}"
      COMMAND "${PKG_CONFIG}" --cflags --libs hetmem ${_private})
  separate_arguments(_sflags UNIX_COMMAND "${RUN_OUT}")
  list(TRANSFORM _sflags REPLACE "^-lhetmem$" "${LIB}/libhetmem.a")
  run("compiling basic.c (static libhetmem.a)"
      COMMAND "${C_COMPILER}" -std=gnu11 ${SAN} "${SOURCE_DIR}/examples/basic.c" ${_sflags}
              -pthread -o "${WORK_DIR}/basic_static")
  run_example("${WORK_DIR}/basic_static")
else()
  message(FATAL_ERROR "install_test: unknown MODE ${MODE}")
endif()
