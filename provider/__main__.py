from .fake_provider import main

main()
