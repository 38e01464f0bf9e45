import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class PrecisConan(ConanFile):
    name = "precis"
    license = "MIT"
    description = "Numeric precision as a compile-time, type-checked choice (C++20, header-only)"
    topics = ("mixed-precision", "float16", "bfloat16", "float8", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    exports_sources = "include/*", "CMakeLists.txt", "cmake/*.cmake", "cmake/*.in", "LICENSE*"
    no_copy_source = True

    def set_version(self):
        # One version for CMake and Conan: the project() line of CMakeLists.txt.
        cmakelists = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(\s*precis\s+VERSION\s+([0-9.]+)", cmakelists)
        self.version = match.group(1)

    def layout(self):
        basic_layout(self)

    def requirements(self):
        # Hana is header-only; xtensor brings xtl. xtensor 0.26 moved its headers into
        # subfolders (<xtensor/containers/xtensor.hpp>), which precis does not include.
        self.requires("boost/[>=1.74]")
        self.requires("xtensor/[>=0.24 <0.26]")

    def package_id(self):
        self.info.clear()

    def validate(self):
        check_min_cppstd(self, 20)

    _build_module = os.path.join("share", "conan", "precis-build-module.cmake")

    def package(self):
        copy(self, "LICENSE*", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"),
             os.path.join(self.package_folder, "include"))
        copy(self, "precis-build-module.cmake", os.path.join(self.source_folder, "cmake", "conan"),
             os.path.dirname(os.path.join(self.package_folder, self._build_module)))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "precis")
        self.cpp_info.set_property("cmake_target_name", "precis::precis")
        # C++20, and boost/xtensor from the system when the profile declares them in
        # [platform_requires] (CMakeDeps then leaves them out).
        self.cpp_info.set_property("cmake_build_modules", [self._build_module])
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.requires = ["boost::headers", "xtensor::xtensor"]
        # cpu_context's worker threads (std::thread).
        if self.settings.get_safe("os") in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
