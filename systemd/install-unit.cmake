# Included by the install script (install(CODE) in CMakeLists.txt), where CMAKE_INSTALL_PREFIX is
# the prefix of this install: "cmake --install --prefix P" or the configured one. Rewrites the
# configured unit's ExecStart for it.
#   kvt_unit_in          the unit as configured
#   kvt_unit_out         where the unit to install is written
#   kvt_exec_configured  "BINDIR/kvtierd --config CONFDIR/" as configured (absolute)
#   kvt_bindir           CMAKE_INSTALL_BINDIR
#   kvt_confdir          KVT_CONFDIR (relative to the prefix, or absolute)
foreach(v bindir confdir)
	if(IS_ABSOLUTE "${kvt_${v}}")
		set(kvt_full_${v} "${kvt_${v}}")
	else()
		set(kvt_full_${v} "${CMAKE_INSTALL_PREFIX}/${kvt_${v}}")
	endif()
endforeach()
file(READ "${kvt_unit_in}" kvt_unit)
string(FIND "${kvt_unit}" "ExecStart=${kvt_exec_configured}" kvt_at)
if(kvt_at LESS 0)
	message(FATAL_ERROR "${kvt_unit_in}: no 'ExecStart=${kvt_exec_configured}' to rewrite")
endif()
string(REPLACE "ExecStart=${kvt_exec_configured}"
	"ExecStart=${kvt_full_bindir}/kvtierd --config ${kvt_full_confdir}/" kvt_unit "${kvt_unit}")
# Removed first: a root install ("sudo cmake --install") leaves a file a later user install could
# not overwrite.
file(REMOVE "${kvt_unit_out}")
file(WRITE "${kvt_unit_out}" "${kvt_unit}")
