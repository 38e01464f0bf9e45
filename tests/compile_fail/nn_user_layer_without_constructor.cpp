// A layer of your own that cannot be made from its blueprint node.
#define USER_LAYER_NO_CONSTRUCTOR
#include "user_layer.hpp"

int main() { user::build_model(); }
