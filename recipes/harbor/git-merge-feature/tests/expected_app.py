def greet(name):
    return "Hello, " + name.strip() + "!"


def farewell(name):
    return "Goodbye, " + name + "."
