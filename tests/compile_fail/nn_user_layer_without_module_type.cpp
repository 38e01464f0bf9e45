// A blueprint node without module_type: nn::build says what a node needs.
#define USER_LAYER_NO_MODULE_TYPE
#include "user_layer.hpp"

int main() { user::build_model(); }
