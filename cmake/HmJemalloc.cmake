# SPDX-License-Identifier: MIT
# HmJemalloc: a private, renamed, dlopen-safe jemalloc 5.3.0 for the jemalloc
# pool (src/pools/jemalloc). Included from the top-level CMakeLists.txt when
# HM_WITH_JEMALLOC is ON.
#
# Why a build from source and not Debian's libjemalloc_pic.a with renamed
# symbols: Debian's objects keep jemalloc's thread data (2632 bytes, je_tsd_tls)
# in the initial-exec TLS model (203 R_X86_64_GOTTPOFF relocations). A shared
# library with initial-exec TLS needs that much of glibc's static TLS surplus
# when it is dlopen()ed, and glibc 2.36 reserves only 1664 bytes: dlopen fails
# with "cannot allocate memory in static TLS block" (Debian's own
# libjemalloc.so.2 fails the same way). Renaming symbols cannot change a TLS
# model, so libhetmem.so could no longer be dlopen()ed at all. We therefore
# build jemalloc 5.3.0 (the version of Debian 12's libjemalloc2) ourselves:
#   --with-jemalloc-prefix=hm_je_ --with-private-namespace=hm_jei_
#       every symbol renamed: nothing can clash with, or replace, the
#       process's malloc or another jemalloc in the process;
#   --without-export   the public API has hidden visibility;
#   --disable-initial-exec-tls, -mtls-dialect=gnu2
#       dynamic TLS through TLS descriptors (as cheap as initial-exec when
#       the library is loaded at start-up, and dlopen-safe);
#   --disable-fill     no junk/zero filling: jemalloc cannot write into pool
#       memory on its own (see the jemalloc pool header);
#   --disable-cxx --disable-prof --disable-libdl --disable-shared
#       no operator new/delete, no profiling, no dlsym;
#   --with-lg-page=12 --with-lg-hugepage=21 --with-lg-vaddr=48
#       the page size, huge page size and address width, which configure
#       would otherwise read from the build machine (sysconf, /proc/meminfo
#       and, on x86-64, cpuid: 48 bits on most CPUs, 57 on those that can
#       run 5-level page tables). A build must not depend on the machine it
#       runs on, and the address width decides the layout of jemalloc's
#       extent map: one word per page, the extent descriptor's address with
#       the size class in the bits above LG_VADDR (RTREE_LEAF_COMPACT,
#       rtree.h), which je_fast.c reads directly; that layout exists only
#       while 64 - LG_VADDR bits hold a size class (232 classes: LG_VADDR <=
#       56), so with 57 je_fast.c stops at its #error. The width is
#       HM_JEMALLOC_ADDR_BITS, read from src/addr_width.h (the one place
#       that states it); jemalloc ignores a key's bits above it, so the
#       pool's extent alloc hook refuses provider memory that reaches 2^48
#       (that header lists every component's limit);
#   --with-malloc-conf=narenas:1,dss:disabled,retain:false
#       one automatic arena (only jemalloc's own metadata uses it); never
#       sbrk(), which would move glibc's heap; no "retain": with retain,
#       jemalloc keeps arenas apart only by "head" marks on the ranges its
#       alloc hook returned, so a piece given back to a provider and reused by
#       another pool's arena could be coalesced across the two arenas (seen
#       as heap corruption in test_jemalloc_isolation); without retain it
#       checks the arena of every neighbour, asks the hook for exactly what it
#       needs, and gives whole extents back to the provider after decay.
#   --disable-cache-oblivious (5.3.0 has no run-time option for it)
#       otherwise jemalloc pads every large allocation with a page so that
#       the block can start at a random cache line of it (sz_large_pad);
#       on a provider that rounds to 2 MiB (device memory) an 8 MiB block
#       then takes 10 MiB, a fifth of the device. Large blocks start
#       page-aligned instead, as the native pool's do.
# The archive is then linked, together with src/pools/jemalloc/je_fast.c (our
# own fast paths, compiled here against jemalloc's internal headers, which the
# cache keeps for that; see that file), into one relocatable object in which
# every symbol but the few the pool calls is made local (objcopy -G), so
# libhetmem.so and libhetmem.a carry no jemalloc symbol anyone could bind to.
# je_fast.c relies on jemalloc internals that change between releases: it is
# compiled only against 5.3.0 (checked here and by an #error in the file).
#
# Where the source comes from, in order:
#   1. HM_JEMALLOC_SOURCE: an unpacked jemalloc-5.3.0 tree, or its release
#      tarball (jemalloc-5.3.0.tar.bz2 == Debian's jemalloc_5.3.0.orig.tar.bz2);
#   2. the tarball cached in HM_JEMALLOC_CACHE_DIR by an earlier configure;
#   3. `apt-get source --download-only jemalloc` from the Debian archive, with
#      a private apt state under the cache (the system's apt state is not
#      touched; apt verifies the archive's signatures).
# The tarball's SHA-256 is checked in every case. The build (about 5 minutes
# on 2 cores) is cached in HM_JEMALLOC_CACHE_DIR, keyed by the configuration,
# and shared by every build tree (a file lock serialises concurrent
# configures).
#
# Results: HM_JEMALLOC_OBJECT (the object to link into the library, made in
# this build tree from the cached archive) and HM_JEMALLOC_INCLUDE_DIR (holds
# hm_jemalloc/jemalloc.h, the renamed API).

set(HM_JEMALLOC_SOURCE "" CACHE PATH
    "jemalloc 5.3.0 source tree or release tarball for the jemalloc pool (empty: cache, then apt-get source)")
if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
  set(_hm_je_default_cache "$ENV{XDG_CACHE_HOME}/hetmem")
elseif(DEFINED ENV{HOME} AND NOT "$ENV{HOME}" STREQUAL "")
  set(_hm_je_default_cache "$ENV{HOME}/.cache/hetmem")
else()
  set(_hm_je_default_cache "${CMAKE_BINARY_DIR}/_hm_cache")
endif()
set(HM_JEMALLOC_CACHE_DIR "${_hm_je_default_cache}" CACHE PATH
    "Where the private jemalloc build is cached (shared by build trees)")

set(_hm_je_version 5.3.0)
set(_hm_je_sha256 2db82d1e7119df3e71b7640219b6dfe84789bc0537983c3b7ac4f7189aecfeaa)
set(_hm_je_tarball_name jemalloc_${_hm_je_version}.orig.tar.bz2)
# The address width (see above), from the one place that states it.
set(_hm_je_width_hdr "${PROJECT_SOURCE_DIR}/src/addr_width.h")
file(STRINGS "${_hm_je_width_hdr}" _hm_je_lg_vaddr REGEX "^#define HM_JEMALLOC_ADDR_BITS [0-9]+$")
if(NOT _hm_je_lg_vaddr MATCHES "^#define HM_JEMALLOC_ADDR_BITS ([0-9]+)$")
  message(FATAL_ERROR "HM_WITH_JEMALLOC: no '#define HM_JEMALLOC_ADDR_BITS <n>' in ${_hm_je_width_hdr}")
endif()
set(_hm_je_lg_vaddr "${CMAKE_MATCH_1}")
set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             "${_hm_je_width_hdr}")
# Any change here changes the cache key, so a stale build is never reused.
set(_hm_je_cflags "-O2 -g0 -fPIC -mtls-dialect=gnu2")
set(_hm_je_configure_args
  --with-jemalloc-prefix=hm_je_ --with-private-namespace=hm_jei_ --without-export
  --disable-initial-exec-tls --disable-cxx --disable-prof --disable-fill --disable-libdl
  --disable-doc --disable-shared --enable-static --with-lg-page=12 --with-lg-hugepage=21
  --with-lg-vaddr=${_hm_je_lg_vaddr}
  --with-malloc-conf=narenas:1,dss:disabled,retain:false --disable-cache-oblivious
  --with-version=5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c)
# The only symbols the pool calls; everything else becomes local.
set(_hm_je_keep hm_je_mallocx hm_je_dallocx hm_je_sdallocx hm_je_rallocx hm_je_xallocx
    hm_je_sallocx hm_je_nallocx hm_je_mallctl hm_je_mallctlnametomib hm_je_mallctlbymib
    hm__je_fast_alloc hm__je_fast_malloc hm__je_fast_free hm__je_fast_check hm__je_fast_tl
    hm__je_fast_tcache_refresh hm__je_fast_key_init hm__je_fast_cached_bytes)
# (je_fast.c calls back hm__je_alloc_slow, hm__je_malloc_slow, hm__je_free_slow, hm__je_refuse in
# the pool: undefined here, resolved when libhetmem is linked.)
set(_hm_je_fast_src "${PROJECT_SOURCE_DIR}/src/pools/jemalloc/je_fast.c")
set(_hm_je_fast_hdr "${PROJECT_SOURCE_DIR}/src/pools/jemalloc/je_fast.h")
# jemalloc registers its fork handlers from its set-up; they must run in the
# library's one fork order (src/fork.h: the pool registry, then jemalloc,
# then the tracker/providers its hooks call), so its pthread_atfork call goes
# to the pool, which puts the handlers in their slot of the library's list.
set(_hm_je_redefine pthread_atfork=hm__jemalloc_pthread_atfork)
# jemalloc's load-time constructor (its one .init_array entry) is taken out:
# it set jemalloc up in every program that loads libhetmem, about 100 KiB of
# memory and its code pages, whether it ever made a jemalloc pool or not.
# jemalloc sets itself up at its first call instead, which the pool makes
# when its first pool is created (once_init, fork-safe there).
set(_hm_je_remove .init_array .rela.init_array)

# "internal-headers": the cache also keeps jemalloc's internal headers and
# compiler flags (for je_fast.c).
string(SHA256 _hm_je_key "internal-headers;${_hm_je_version};${_hm_je_cflags};${_hm_je_configure_args};${CMAKE_C_COMPILER_ID};${CMAKE_C_COMPILER_VERSION};${CMAKE_SYSTEM_PROCESSOR}")
string(SUBSTRING "${_hm_je_key}" 0 12 _hm_je_key)
set(_hm_je_dir "${HM_JEMALLOC_CACHE_DIR}/jemalloc-${_hm_je_version}-${_hm_je_key}")
set(_hm_je_archive "${_hm_je_dir}/lib/libjemalloc_pic.a")
set(HM_JEMALLOC_OBJECT "${CMAKE_BINARY_DIR}/hm_jemalloc/hm_jemalloc.o")
set(HM_JEMALLOC_INCLUDE_DIR "${_hm_je_dir}/include")
set(_hm_je_stamp "${_hm_je_dir}/done.stamp")

function(_hm_je_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(LENGTH "${out}${err}" n)
    set(tail "${out}${err}")
    if(n GREATER 4000)
      math(EXPR start "${n} - 4000")
      string(SUBSTRING "${out}${err}" ${start} 4000 tail)
    endif()
    message(FATAL_ERROR "HM_WITH_JEMALLOC: ${what} failed (${rc}):\n${tail}\n"
            "Set HM_WITH_JEMALLOC=OFF to build without the jemalloc pool.")
  endif()
endfunction()

function(_hm_je_check_tarball file out_ok)
  file(SHA256 "${file}" sum)
  if(sum STREQUAL _hm_je_sha256)
    set(${out_ok} TRUE PARENT_SCOPE)
  else()
    message(WARNING "HM_WITH_JEMALLOC: ${file} has SHA-256 ${sum}, expected ${_hm_je_sha256}; not used")
    set(${out_ok} FALSE PARENT_SCOPE)
  endif()
endfunction()

# Find or fetch the source; sets _hm_je_srcdir (an unpacked tree) in the caller.
macro(_hm_je_get_source)
  set(_tar "")
  set(_hm_je_srcdir "")
  if(HM_JEMALLOC_SOURCE)
    if(IS_DIRECTORY "${HM_JEMALLOC_SOURCE}")
      if(NOT EXISTS "${HM_JEMALLOC_SOURCE}/configure" OR NOT EXISTS "${HM_JEMALLOC_SOURCE}/VERSION")
        message(FATAL_ERROR "HM_JEMALLOC_SOURCE=${HM_JEMALLOC_SOURCE}: no configure/VERSION (a release tree is needed)")
      endif()
      file(READ "${HM_JEMALLOC_SOURCE}/VERSION" _v)
      if(NOT _v MATCHES "^5\\.3\\.0")
        message(FATAL_ERROR "HM_JEMALLOC_SOURCE: version ${_v}, the pool needs 5.3.0")
      endif()
      set(_hm_je_srcdir "${HM_JEMALLOC_SOURCE}")
    else()
      _hm_je_check_tarball("${HM_JEMALLOC_SOURCE}" _ok)
      if(NOT _ok)
        message(FATAL_ERROR "HM_JEMALLOC_SOURCE=${HM_JEMALLOC_SOURCE} is not the jemalloc 5.3.0 release tarball")
      endif()
      set(_tar "${HM_JEMALLOC_SOURCE}")
    endif()
  endif()
  if(NOT _hm_je_srcdir AND NOT _tar AND EXISTS "${HM_JEMALLOC_CACHE_DIR}/${_hm_je_tarball_name}")
    _hm_je_check_tarball("${HM_JEMALLOC_CACHE_DIR}/${_hm_je_tarball_name}" _ok)
    if(_ok)
      set(_tar "${HM_JEMALLOC_CACHE_DIR}/${_hm_je_tarball_name}")
    endif()
  endif()
  if(NOT _hm_je_srcdir AND NOT _tar)
    find_program(_hm_apt_get apt-get)
    if(NOT _hm_apt_get)
      message(FATAL_ERROR "HM_WITH_JEMALLOC: no jemalloc source: set HM_JEMALLOC_SOURCE to the "
              "jemalloc-5.3.0 release tarball (or tree), or build on Debian with apt-get")
    endif()
    set(_codename bookworm)
    if(EXISTS /etc/os-release)
      file(STRINGS /etc/os-release _osr REGEX "^VERSION_CODENAME=")
      if(_osr MATCHES "VERSION_CODENAME=\"?([a-z]+)")
        set(_codename "${CMAKE_MATCH_1}")
      endif()
    endif()
    set(HM_JEMALLOC_DEB_MIRROR "http://deb.debian.org/debian" CACHE STRING
        "Debian archive for apt-get source jemalloc")
    set(_apt "${HM_JEMALLOC_CACHE_DIR}/apt")
    file(MAKE_DIRECTORY "${_apt}/lists/partial" "${_apt}/cache/archives/partial" "${_apt}/src")
    set(_keyring /usr/share/keyrings/debian-archive-keyring.gpg)
    file(WRITE "${_apt}/sources.list"
         "deb-src [signed-by=${_keyring}] ${HM_JEMALLOC_DEB_MIRROR} ${_codename} main\n")
    set(_aptopts -o "Dir::Etc::SourceList=${_apt}/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=${_apt}/lists" -o "Dir::Cache=${_apt}/cache" -o "Debug::NoLocking=1"
        -o "APT::Sandbox::User=root" -q)
    message(STATUS "HM_WITH_JEMALLOC: fetching jemalloc ${_hm_je_version} source from ${HM_JEMALLOC_DEB_MIRROR} (${_codename})")
    _hm_je_run("apt-get update (private state in ${_apt})" ${_hm_apt_get} ${_aptopts} update)
    execute_process(COMMAND ${_hm_apt_get} ${_aptopts} source --download-only jemalloc
                    WORKING_DIRECTORY "${_apt}/src" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT EXISTS "${_apt}/src/${_hm_je_tarball_name}")
      message(FATAL_ERROR "HM_WITH_JEMALLOC: apt-get source jemalloc did not give ${_hm_je_tarball_name} "
              "(rc ${_rc}); set HM_JEMALLOC_SOURCE to the jemalloc-5.3.0 release tarball")
    endif()
    _hm_je_check_tarball("${_apt}/src/${_hm_je_tarball_name}" _ok)
    if(NOT _ok)
      message(FATAL_ERROR "HM_WITH_JEMALLOC: the downloaded tarball is not jemalloc 5.3.0")
    endif()
    file(COPY_FILE "${_apt}/src/${_hm_je_tarball_name}" "${HM_JEMALLOC_CACHE_DIR}/${_hm_je_tarball_name}")
    set(_tar "${HM_JEMALLOC_CACHE_DIR}/${_hm_je_tarball_name}")
  endif()
  if(NOT _hm_je_srcdir)
    file(REMOVE_RECURSE "${_hm_je_dir}/src")
    file(MAKE_DIRECTORY "${_hm_je_dir}/src")
    _hm_je_run("unpacking ${_tar}" ${CMAKE_COMMAND} -E tar xf "${_tar}"
               WORKING_DIRECTORY "${_hm_je_dir}/src")
    set(_hm_je_srcdir "${_hm_je_dir}/src/jemalloc-${_hm_je_version}")
  endif()
endmacro()

if(NOT EXISTS "${_hm_je_stamp}")
  file(MAKE_DIRECTORY "${_hm_je_dir}")
  file(LOCK "${_hm_je_dir}.lock" GUARD FILE TIMEOUT 1800 RESULT_VARIABLE _lock_rc)
  if(NOT _lock_rc STREQUAL "0")
    message(FATAL_ERROR "HM_WITH_JEMALLOC: cannot lock ${_hm_je_dir}.lock: ${_lock_rc}")
  endif()
  if(NOT EXISTS "${_hm_je_stamp}") # another configure may have built it meanwhile
    find_program(_hm_make NAMES make gmake REQUIRED)
    find_program(_hm_objcopy NAMES objcopy REQUIRED)
    find_program(_hm_ld NAMES ld REQUIRED)
    _hm_je_get_source()
    cmake_host_system_information(RESULT _ncpu QUERY NUMBER_OF_LOGICAL_CORES)
    message(STATUS "HM_WITH_JEMALLOC: building the private jemalloc ${_hm_je_version} in ${_hm_je_dir} "
            "(once; a few minutes)")
    file(REMOVE_RECURSE "${_hm_je_dir}/build" "${_hm_je_dir}/lib" "${_hm_je_dir}/include"
         "${_hm_je_dir}/internal")
    file(MAKE_DIRECTORY "${_hm_je_dir}/build" "${_hm_je_dir}/lib" "${_hm_je_dir}/include/hm_jemalloc"
         "${_hm_je_dir}/internal")
    # Plain compiler and flags: no sanitizer or project flags reach jemalloc.
    _hm_je_run("jemalloc configure"
      ${CMAKE_COMMAND} -E env --unset=LDFLAGS --unset=CPPFLAGS --unset=MALLOC_CONF
      "CC=${CMAKE_C_COMPILER}" "CFLAGS=${_hm_je_cflags}"
      "${_hm_je_srcdir}/configure" ${_hm_je_configure_args}
      WORKING_DIRECTORY "${_hm_je_dir}/build")
    _hm_je_run("jemalloc build" ${_hm_make} -j${_ncpu} lib/libjemalloc_pic.a
               WORKING_DIRECTORY "${_hm_je_dir}/build")
    # jemalloc's own compiler flags, for je_fast.c (its Makefile's CFLAGS,
    # PIC_CFLAGS and CPPFLAGS without the include directories).
    file(WRITE "${_hm_je_dir}/build/hm_flags.mk"
         "hm_flags:\n\t@echo '$(CFLAGS) $(PIC_CFLAGS) $(filter-out -I%,$(CPPFLAGS))' > hm_cflags.txt\n")
    _hm_je_run("jemalloc flags" ${_hm_make} -s -f Makefile -f hm_flags.mk hm_flags
               WORKING_DIRECTORY "${_hm_je_dir}/build")
    file(COPY_FILE "${_hm_je_dir}/build/hm_cflags.txt" "${_hm_je_dir}/internal/cflags.txt")
    # Internal headers: the configured ones, then the source tree's.
    file(COPY "${_hm_je_dir}/build/include/jemalloc" DESTINATION "${_hm_je_dir}/internal/gen")
    file(COPY "${_hm_je_srcdir}/include/jemalloc" DESTINATION "${_hm_je_dir}/internal/src")
    file(WRITE "${_hm_je_dir}/internal/VERSION" "${_hm_je_version}\n")
    file(COPY_FILE "${_hm_je_dir}/build/lib/libjemalloc_pic.a" "${_hm_je_archive}")
    file(COPY_FILE "${_hm_je_dir}/build/include/jemalloc/jemalloc.h"
         "${_hm_je_dir}/include/hm_jemalloc/jemalloc.h")
    file(WRITE "${_hm_je_stamp}" "jemalloc ${_hm_je_version}: ${_hm_je_configure_args}\n")
    # Keep only what the build uses: the archive and the header.
    file(REMOVE_RECURSE "${_hm_je_dir}/build" "${_hm_je_dir}/src")
  endif()
  file(LOCK "${_hm_je_dir}.lock" RELEASE)
endif()
# This build tree's object: the archive and je_fast.o as one relocatable
# object, every symbol but _hm_je_keep local, pthread_atfork redirected, the
# constructor taken out (see above). Made at configure time; an edit of
# je_fast.c re-runs configure.
set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             "${_hm_je_fast_src}" "${_hm_je_fast_hdr}")
file(READ "${_hm_je_dir}/internal/VERSION" _hm_je_int_version)
string(STRIP "${_hm_je_int_version}" _hm_je_int_version)
if(NOT _hm_je_int_version STREQUAL "5.3.0")
  message(FATAL_ERROR "HM_WITH_JEMALLOC: the cached jemalloc is ${_hm_je_int_version}; "
          "src/pools/jemalloc/je_fast.c uses jemalloc 5.3.0's internals and only those")
endif()
# The width the cached build really has (its generated header), checked
# against the pin: a build from an older configuration, or a configure that
# ignored the option, must not reach je_fast.c or the pool's check.
file(STRINGS "${_hm_je_dir}/internal/gen/jemalloc/internal/jemalloc_internal_defs.h" _hm_je_got_vaddr
     REGEX "^#define LG_VADDR ")
if(NOT _hm_je_got_vaddr STREQUAL "#define LG_VADDR ${_hm_je_lg_vaddr}")
  message(FATAL_ERROR "HM_WITH_JEMALLOC: the private jemalloc in ${_hm_je_dir} has '${_hm_je_got_vaddr}', "
          "expected LG_VADDR ${_hm_je_lg_vaddr} (--with-lg-vaddr); remove that directory to rebuild it")
endif()
file(SHA256 "${_hm_je_fast_src}" _hm_je_fast_sum)
file(SHA256 "${_hm_je_fast_hdr}" _hm_je_fast_hsum)
string(SHA256 _hm_je_post "${_hm_je_archive};${_hm_je_lg_vaddr};${_hm_je_keep};${_hm_je_redefine};${_hm_je_remove};${_hm_je_fast_sum};${_hm_je_fast_hsum}")
if(NOT EXISTS "${HM_JEMALLOC_OBJECT}" OR NOT EXISTS "${HM_JEMALLOC_OBJECT}.${_hm_je_post}"
   OR "${_hm_je_archive}" IS_NEWER_THAN "${HM_JEMALLOC_OBJECT}")
  find_program(_hm_objcopy NAMES objcopy REQUIRED)
  find_program(_hm_ld NAMES ld REQUIRED)
  file(REMOVE_RECURSE "${CMAKE_BINARY_DIR}/hm_jemalloc")
  file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/hm_jemalloc")
  # je_fast.c with jemalloc's flags (never sanitizer or project flags: it is
  # part of jemalloc, whose inline functions it expands).
  file(READ "${_hm_je_dir}/internal/cflags.txt" _hm_je_fast_flags)
  separate_arguments(_hm_je_fast_flags UNIX_COMMAND "${_hm_je_fast_flags}")
  _hm_je_run("compiling ${_hm_je_fast_src} against jemalloc ${_hm_je_version}'s internal headers"
             ${CMAKE_C_COMPILER} ${_hm_je_fast_flags} -I "${_hm_je_dir}/internal/gen"
             -I "${_hm_je_dir}/internal/src" -I "${PROJECT_SOURCE_DIR}/include"
             -DHM_JEMALLOC_ADDR_BITS=${_hm_je_lg_vaddr}
             -c "${_hm_je_fast_src}"
             -o "${CMAKE_BINARY_DIR}/hm_jemalloc/je_fast.o")
  _hm_je_run("ld -r" ${_hm_ld} -r "${CMAKE_BINARY_DIR}/hm_jemalloc/je_fast.o"
             --whole-archive "${_hm_je_archive}" -o "${CMAKE_BINARY_DIR}/hm_jemalloc/all.o")
  set(_args "")
  foreach(s ${_hm_je_keep})
    list(APPEND _args -G ${s})
  endforeach()
  foreach(r ${_hm_je_redefine})
    list(APPEND _args --redefine-sym ${r})
  endforeach()
  foreach(r ${_hm_je_remove})
    list(APPEND _args --remove-section ${r})
  endforeach()
  _hm_je_run("objcopy" ${_hm_objcopy} ${_args} "${CMAKE_BINARY_DIR}/hm_jemalloc/all.o"
             "${HM_JEMALLOC_OBJECT}")
  file(REMOVE "${CMAKE_BINARY_DIR}/hm_jemalloc/all.o")
  file(WRITE "${HM_JEMALLOC_OBJECT}.${_hm_je_post}" "")
endif()
message(STATUS "HM_WITH_JEMALLOC: private jemalloc ${_hm_je_version} from ${_hm_je_dir}")
message(STATUS "HM_WITH_JEMALLOC: built for ${_hm_je_lg_vaddr}-bit addresses (--with-lg-vaddr="
        "${_hm_je_lg_vaddr}, not the build CPU's width: je_fast.c reads jemalloc's one-word extent "
        "map, which needs <= 56); the jemalloc pool refuses memory at or above 2^${_hm_je_lg_vaddr}")
